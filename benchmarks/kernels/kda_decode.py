#!/usr/bin/env python
"""A KDA decode step through chapter 08j's one kernel against the unfused path of chapter 08d's op and `o_norm`, on one GPU.

    python -m benchmarks.kernels.kda_decode [--tokens 1,2,4,8] [--warps 4,8,16] [--out DIR]

Needs vLLM: the unfused path is vLLM 0.25.1's causal-conv and FLA kernels, called as chapter 08d's op calls them
(`triton_kernels()`), so this runs on the GPU machine after the staging steps. Real per-rank shapes at TP2: 32 heads
of 128, conv width 4, the conv state in vLLM's layout for this platform.

Checks first, on the GPU:
* the chapter's cases in fp32 against `kda_decode_torch` (`self_check`);
* the real shapes in bf16: the kernel and the unfused path, each against `kda_decode_torch` computed in fp32 from the
  same bf16 inputs (output, recurrent state, conv state). The kernel passes if its distance is at most 1.5x the
  unfused path's plus 1e-3.

Then, per token count, each path is captured in one CUDA graph over enough rotations (distinct state slots) that the
states one replay touches exceed the 50 MB L2, as in the engine, where a layer's state is cold by the time the layer
runs again. Reported: microseconds per decode step of one layer, unfused (zeros, conv update, gate, recurrent, copy,
`FusedRMSNormGated`) and the kernel per warp count, and their ratio.

Output: `benchmarks/results/incoming/kda_decode_h200.json` (and `$OUT/` when set), written after every row.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

from benchmarks.common import ROOT, add_run_args, int_list, json_writer, result_head, result_paths, time_graph
from solar_open2.config import SolarOpen2Config

TP = 2
L2_BYTES = 50 * 2 ** 20

def rank_shapes(cfg:SolarOpen2Config, tp:int=TP)->dict:
    "One KDA layer on one rank: its heads, head size and conv width."
    return dict(Hl=cfg.kda_num_heads // tp, D=cfg.kda_head_dim, W=cfg.kda_conv_size)

REAL = rank_shapes(SolarOpen2Config.real())

def make_inputs(T:int, slots:int, Hl:int, D:int, W:int, dtype, device, dim_first:bool=True, seed:int=0)->dict:
    "`kda_decode_torch` arguments at these shapes; the conv state as vLLM allocates it (`dim_first`: [slots, 3P, W-1])."
    import torch
    from solar_open2.vllm.ops.kda_decode import random_case
    c = random_case(T, T, Hl, D, W, slots, dtype, seed, null_row=False)
    c["idx"] = torch.arange(1, T + 1, dtype=torch.int32)                   # slots 1..T; rotations shift them
    return on_device(c, device, dim_first)

def on_device(c:dict, device, dim_first:bool)->dict:
    "A case's tensors on `device`, its conv state stored as vLLM allocates it (not `dim_first`: [slots, cols, 3P] storage, seen as [slots, 3P, cols])."
    import torch
    if not dim_first: c["conv_state"] = c["conv_state"].transpose(1, 2).contiguous().transpose(1, 2)
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in c.items()}

def o_norm_module(D:int, eps:float, weight, device):
    """vLLM's `FusedRMSNormGated(D, eps, activation='sigmoid')` with `weight`, as chapter 08d builds `o_norm`; its call.
    On CUDA its Triton kernel (`forward_cuda`, one launch) stands in for the two inductor kernels the engine compiles
    from `forward_native` (chapter 09's trace): one kernel fewer than the engine runs, in the unfused path's favour."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from solar_open2.vllm.compat import FusedRMSNormGated      # its home moved in vLLM 0.26.0
    if device == "cpu":
        from solar_open2.vllm.testing import force_cpu_platform
        force_cpu_platform()
    with set_current_vllm_config(VllmConfig()): m = FusedRMSNormGated(D, eps=eps, activation="sigmoid")
    m.weight.data = weight.to(dtype=m.weight.dtype)
    m = m.to(device)
    return m.forward_cuda if device == "cuda" else m.forward_native

def unfused_step(c:dict, kn, o_norm)->"torch.Tensor":
    "One decode step as chapter 08j's fallback runs it: zeros, 08d's `kda_decode_unfused`, the copy, `o_norm` ([T, Hl, D])."
    import torch
    from solar_open2.vllm.kda import kda_decode_unfused
    T = c["qkv"].shape[0]
    _, Hl, D, _ = c["rec_state"].shape
    idx = c["idx"]
    n = idx.shape[0]
    core = torch.zeros(T, Hl, D, dtype=c["qkv"].dtype, device=c["qkv"].device)
    o = kda_decode_unfused(kn, c["qkv"][:n], c["conv_state"], c["conv_w"].reshape(3 * Hl * D, -1), c["g1"][:n], c["A_log"],
                           c["dt_bias"], c["beta"][:n], c["rec_state"], idx,
                           torch.arange(n + 1, dtype=torch.int32, device=idx.device))   # qkv convolved in place, as in the engine
    core[:n] = o[0, :n]
    return o_norm(core, c["g2"].reshape(T, Hl, D))

def bf16_check(kn, device, shapes:dict, T:int=4, dim_first:bool=True)->dict:
    "Kernel and unfused path against `kda_decode_torch` (fp32 math on the same bf16 inputs) at the given shapes."
    import torch
    from solar_open2.nvfp4 import relative_rms
    from solar_open2.vllm.ops import kda_decode as kd
    c = make_inputs(T, T + 2, shapes["Hl"], shapes["D"], shapes["W"], torch.bfloat16, device, dim_first, seed=3)
    clone = lambda: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in c.items()}
    ref, got, unf = clone(), clone(), clone()
    y_ref = kd.kda_decode_torch(**ref)
    y_got = kd.kda_decode_triton(**got)
    y_unf = unfused_step(unf, kn, o_norm_module(shapes["D"], c["eps"], c["norm_w"], device))
    live = c["idx"].long()
    r = {"case": [T, shapes["Hl"], shapes["D"], shapes["W"]], "dtype": "bfloat16", "dim_first": dim_first}
    for name, d in (("kernel", got), ("unfused", unf)):
        y = y_got if name == "kernel" else y_unf
        r[name] = {"out": relative_rms(y.float().cpu(), y_ref.float().cpu()),
                   "rec_state": relative_rms(d["rec_state"][live].cpu(), ref["rec_state"][live].cpu()),
                   "conv_state": relative_rms(d["conv_state"][live].float().cpu(), ref["conv_state"][live].float().cpu())}
    r["kernel_vs_unfused_out"] = relative_rms(y_got.float().cpu(), y_unf.float().cpu())
    r["pass"] = all(r["kernel"][k] <= 1.5 * r["unfused"][k] + 1e-3 for k in ("out", "rec_state", "conv_state"))
    return r

def rotations_for(T:int, Hl:int, D:int)->int:
    "Rotations whose recurrent states together exceed twice the L2: each replay finds its states in HBM."
    per = T * Hl * D * D * 4
    return max(8, -(-2 * L2_BYTES // per))

GATE_RULE = "fp32 cases within 1e-5 of the plain path (other states untouched); bf16 at most 1.5x the plain path's distance"

def gate(res:dict)->bool:
    "The sanity gate: the fp32 cases match the plain path and the bf16 check passes."
    fp32 = [c for c in res["checks"] if c["kind"] == "fp32 cases"]
    bf16 = [c for c in res["checks"] if c["kind"].startswith("bf16")]
    return bool(fp32 and bf16) and all(max(c["out"], c["rec_state"], c["conv_state"]) < 1e-5 and c["untouched"] for c in fp32) \
        and all(c["pass"] for c in bf16)

def start(name:str, device:str, shapes:dict|None, kernels, dim_first:bool|None)->tuple:
    """What this benchmark and `kda_verify` begin with: `(shapes, kernels, dim_first, res)`, vLLM's Triton kernels and its
    conv-state layout where none are given, and the result's head with vLLM's version."""
    shp = dict(shapes or REAL)
    if kernels is None:
        from solar_open2.vllm.kda import triton_kernels
        kernels = triton_kernels()
    if dim_first is None:
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
        dim_first = is_conv_state_dim_first()
    res = {**result_head(name, device, ROOT), "shapes": shp, "conv_state_dim_first": dim_first, "unfused_kernels": kernels.name,
           "checks": [], "timings": [], "skipped": []}
    try:
        import vllm
        res["versions"]["vllm"] = vllm.__version__
    except ImportError: pass
    return shp, kernels, dim_first, res

def run(tokens=(1, 2, 4, 8), warps=(4, 8, 16), reps:int=50, deadline_s:float=120.0, out_paths=(), device:str="cuda",
        shapes:dict|None=None, timer=None, kernels=None, dim_first:bool|None=None, rotations=None)->dict:
    """Checks, then per token count the unfused path and the kernel per warp count, each in one CUDA graph.
    `device`, `shapes`, `timer`, `kernels` (08d's torch set), `dim_first` and `rotations` exist for the CPU test."""
    import torch
    from solar_open2.vllm.ops import kda_decode as kd
    t0, timer = time.perf_counter(), timer or time_graph
    shp, kernels, dim_first, res = start("kda_decode_h200", device, shapes, kernels, dim_first)
    save = json_writer(res, out_paths, gate, GATE_RULE)
    res["checks"] = [{**c, "kind": "fp32 cases"} for c in kd.self_check(device=device)]
    res["checks"].append({**bf16_check(kernels, device, shp, dim_first=dim_first), "kind": "bf16, against the unfused path"})
    save()
    late = lambda: time.perf_counter() - t0 > deadline_s
    Hl, D, W = shp["Hl"], shp["D"], shp["W"]
    for T in tokens:
        R = rotations or rotations_for(T, Hl, D)
        c = make_inputs(T, 1 + R * T, Hl, D, W, torch.bfloat16, device, dim_first, seed=T)
        idxs = [torch.arange(1 + r * T, 1 + (r + 1) * T, dtype=torch.int32, device=device) for r in range(R)]
        o_norm = o_norm_module(D, c["eps"], c["norm_w"], device)
        out = torch.empty(T, Hl, D, dtype=torch.bfloat16, device=device)
        rows = {}
        variants = [("unfused", None)] + [("kernel", w) for w in warps]
        for name, w in variants:
            if late(): res["skipped"].append({"tokens": T, "path": name, "num_warps": w}); continue
            if name == "unfused": fns = [lambda i=i: unfused_step({**c, "idx": i}, kernels, o_norm) for i in idxs]
            else: fns = [lambda i=i, w=w: kd.kda_decode_triton(**{**c, "idx": i}, out=out, num_warps=w) for i in idxs]
            try: us = timer(fns, reps)
            except Exception as e:                                           # record, keep going
                res["timings"].append({"tokens": T, "path": name, "num_warps": w, "error": f"{type(e).__name__}: {e}"[:400]})
                continue
            r = {"tokens": T, "path": name, "num_warps": w, "rotations": R, "us": round(us, 2)}
            rows[(name, w)] = r
            res["timings"].append(r); print(json.dumps(r), flush=True); save()
        ks = [r for (name, _), r in rows.items() if name == "kernel"]
        if ks and ("unfused", None) in rows:
            best = min(ks, key=lambda r: r["us"])
            res.setdefault("best", {})[str(T)] = {"unfused_us": rows[("unfused", None)]["us"], "kernel_us": best["us"],
                                                  "num_warps": best["num_warps"],
                                                  "unfused_over_kernel": round(rows[("unfused", None)]["us"] / best["us"], 2)}
        save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=(1, 2, 4, 8))
    ap.add_argument("--warps", type=int_list, default=(4, 8, 16), help="num_warps values for the kernel")
    add_run_args(ap, reps=50, deadline_s=120.0)
    a = ap.parse_args(argv)
    outs = result_paths("kda_decode_h200", a.results_dir, a.out)
    if outs is None: return 2
    res = run(a.tokens, a.warps, a.reps, a.deadline_s, outs)
    for c in res["checks"]: print("check", json.dumps(c))
    for T, b in res.get("best", {}).items():
        print(f"{T} token(s): unfused {b['unfused_us']} us, kernel {b['kernel_us']} us ({b['num_warps']} warps), "
              f"x{b['unfused_over_kernel']}")
    return 0 if gate(res) else 1

if __name__ == "__main__":
    sys.exit(main())
