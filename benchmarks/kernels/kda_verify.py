#!/usr/bin/env python
"""A speculative verify step of one KDA layer: the verify kernel (`ops/kda_decode`) against the op body's unfused path
(`vllm/kda`'s `kda_verify_unfused` and `o_norm`), and the one-token decode kernel beside them, on one GPU.

    python -m benchmarks.kernels.kda_verify [--requests 1,2,4,8] [--drafts 1,3,7] [--splits 2,4,8] [--out DIR]

Needs vLLM: the unfused path is vLLM 0.25.1's causal-conv update and FLA KDA kernels with `num_accepted_tokens`, as
the op body calls them (`triton_kernels()`), so this runs on the GPU machine after the staging steps. Real per-rank
shapes at TP2: 32 heads of 128, conv width 4, the conv state in vLLM's layout for this platform, widened by the drafts.

Checks first, on the GPU:
* the chapter's cases in fp32 against `kda_verify_torch` (`verify_check`), for the one-launch kernel and for each
  split form (`--splits`: each head's value rows over that many programs, then the finishing launch);
* the real shapes in bf16 (two requests of 1 + 3 tokens, resumed after 2 and after 0 accepted drafts): the kernel and
  the unfused path, each against `kda_verify_torch` computed from the same bf16 inputs (output, the recurrent states of
  every token's slot, the conv states). The kernel (and each split form) passes if its distance is at most 1.5x the
  unfused path's plus 1e-3.

Then, per (requests, drafts), each path captured in one CUDA graph over enough rotations (distinct slot rows) that the
states one replay touches exceed twice the 50 MB L2, as in the engine. Reported: microseconds per verify step of one
layer, unfused (zeros, conv update, gate, recurrent, zeroing, `FusedRMSNormGated`), the kernel and each split form,
the unfused path over the kernel, the fastest form, and the kernel's time over the one-token decode kernel's at the same
request count (what a verify of 1 + k costs over a plain step in this layer).

Output: `benchmarks/results/incoming/kda_verify_h200.json` (and `$OUT/` when set), written after every row.
"""
from __future__ import annotations
import argparse, json, sys, time

from benchmarks.common import add_run_args, int_list, json_writer, result_paths, time_graph
from benchmarks.kernels import kda_decode
from benchmarks.kernels.kda_decode import gate, make_inputs, o_norm_module, on_device, start

def verify_inputs(N:int, k:int, slots:int, Hl:int, D:int, W:int, dtype, device, dim_first:bool=True, seed:int=0,
                  nacc=None)->dict:
    "`kda_verify_torch` arguments for N requests of 1 + k tokens on slots 1..N(1+k); the conv state in vLLM's layout for this platform."
    import torch
    from solar_open2.vllm.ops.kda_decode import random_verify_case
    c = random_verify_case(N, k + 1, Hl, D, W, slots, nacc=nacc, dtype=dtype, seed=seed, null_req=False, pad_tokens=0)
    c["rows"] = torch.arange(1, 1 + N * (k + 1), dtype=torch.int32).reshape(N, k + 1)   # rotations shift them
    return on_device(c, device, dim_first)

def unfused_verify(c:dict, kn, o_norm)->"torch.Tensor":
    "The op body's verify as the layer runs it with the kernel off: `kda_verify_unfused` into a zeroed core, then `o_norm`."
    from solar_open2.vllm.kda import kda_verify_unfused
    T = c["qkv"].shape[0]
    _, Hl, D, _ = c["rec_state"].shape
    W = c["conv_w"].shape[-1]
    core = kda_verify_unfused(kn, c["qkv"], c["conv_state"], c["conv_w"].reshape(3 * Hl * D, W), c["g1"], c["A_log"],
                              c["dt_bias"], c["beta"], c["rec_state"], c["rows"], c["nacc"], c["qsl"], c["rows"].shape[0])
    return o_norm(core, c["g2"].reshape(T, Hl, D))

def bf16_check(kn, device, shapes:dict, dim_first:bool=True, splits=())->dict:
    "Kernel (and its split forms) and unfused path against `kda_verify_torch` (fp32 math on the same bf16 inputs): two requests of 1 + 3 tokens."
    import torch
    from solar_open2.nvfp4 import relative_rms
    from solar_open2.vllm.ops import kda_decode as kd
    c = verify_inputs(2, 3, 10, shapes["Hl"], shapes["D"], shapes["W"], torch.bfloat16, device, dim_first, seed=3, nacc=[3, 1])
    clone = lambda: {key: (v.clone() if torch.is_tensor(v) else v) for key, v in c.items()}
    ref, got, unf = clone(), clone(), clone()
    y_ref = kd.kda_verify_torch(**ref)
    y_got = kd.kda_verify_triton(**got, v_split=1)
    y_unf = unfused_verify(unf, kn, o_norm_module(shapes["D"], c["eps"], c["norm_w"], device))
    forms = [("kernel", got, y_got), ("unfused", unf, y_unf)]
    for sp in splits:
        d = clone()
        forms.append((f"split{sp}", d, kd.kda_verify_triton(**d, v_split=sp)))
    owned, heads = c["rows"].flatten().long(), c["rows"][:, 0].long()
    r = {"case": [2, 4, shapes["Hl"], shapes["D"], shapes["W"]], "nacc": [3, 1], "dtype": "bfloat16", "dim_first": dim_first}
    for name, d, y in forms:
        r[name] = {"out": relative_rms(y.float().cpu(), y_ref.float().cpu()),
                   "rec_state": relative_rms(d["rec_state"][owned].cpu(), ref["rec_state"][owned].cpu()),
                   "conv_state": relative_rms(d["conv_state"][heads, :, :6].float().cpu(), ref["conv_state"][heads, :, :6].float().cpu())}
    r["kernel_vs_unfused_out"] = relative_rms(y_got.float().cpu(), y_unf.float().cpu())
    r["pass"] = all(r[name][key] <= 1.5 * r["unfused"][key] + 1e-3 for name, _, _ in forms if name != "unfused"
                    for key in ("out", "rec_state", "conv_state"))
    return r

def rotations_for(N:int, k:int, Hl:int, D:int)->int:
    "Rotations whose recurrent states (every token's slot: N(1 + k) of them) together exceed twice the L2, as for the decode kernel."
    return kda_decode.rotations_for(N * (k + 1), Hl, D)

GATE_RULE = "fp32 cases within 1e-5 of the plain path (slots no request owns untouched); bf16 at most 1.5x the unfused path's distance"
# the sanity gate is the decode benchmark's (`gate`, imported above): the same two kinds of checks

def run(requests=(1, 2, 4, 8), drafts=(1, 3, 7), reps:int=50, deadline_s:float=120.0, out_paths=(), device:str="cuda",
        shapes:dict|None=None, timer=None, kernels=None, dim_first:bool|None=None, rotations=None, splits=(2, 4, 8))->dict:
    """Checks, then per (requests, drafts) the unfused path and the kernel, and per request count the decode kernel, each
    in one CUDA graph, none started later than `deadline_s` after the checks. `device`, `shapes`, `timer`, `kernels` (the torch set), `dim_first` and `rotations` exist for the CPU test."""
    import torch
    from solar_open2.vllm.ops import kda_decode as kd
    t0, timer = time.perf_counter(), timer or time_graph
    shp, kernels, dim_first, res = start("kda_verify_h200", device, shapes, kernels, dim_first)
    save = json_writer(res, out_paths, gate, GATE_RULE, figures=("ratios",))   # the summary, withheld if the gate fails
    res["splits"] = list(splits)
    for sp in (1, *splits):                                                   # the gate holds every form to the plain path
        res["checks"] += [{**c, "kind": "fp32 cases", "v_split": sp} for c in kd.verify_check(device=device, v_split=sp)]
    res["checks"].append({**bf16_check(kernels, device, shp, dim_first, splits), "kind": "bf16, against the unfused path"})
    res["checks_s"] = round(time.perf_counter() - t0, 1)                     # their compiles: 120 s on an H100 (2026-12-08)
    save()
    t1 = time.perf_counter()                                                  # `deadline_s` is the timings' own, after the checks
    late = lambda: time.perf_counter() - t1 > deadline_s
    Hl, D, W = shp["Hl"], shp["D"], shp["W"]
    rows = {}
    for N in requests:
        R = rotations or rotations_for(N, 0, Hl, D)                           # the one-token kernel: the plain step's cost
        c = make_inputs(N, 1 + R * N, Hl, D, W, torch.bfloat16, device, dim_first, seed=N)
        idxs = [torch.arange(1 + r * N, 1 + (r + 1) * N, dtype=torch.int32, device=device) for r in range(R)]
        out = torch.empty(N, Hl, D, dtype=torch.bfloat16, device=device)
        if late(): res["skipped"].append({"requests": N, "drafts": 0, "path": "decode"})
        else:
            us = timer([lambda i=i: kd.kda_decode_triton(**{**c, "idx": i}, out=out) for i in idxs], reps)
            rows[(N, 0, "decode")] = r = {"requests": N, "drafts": 0, "path": "decode", "rotations": R, "us": round(us, 2)}
            res["timings"].append(r); print(json.dumps(r), flush=True); save()
        for k in drafts:
            R = rotations or rotations_for(N, k, Hl, D)
            c = verify_inputs(N, k, 1 + R * N * (k + 1), Hl, D, W, torch.bfloat16, device, dim_first, seed=N + 10 * k)
            rws = [c["rows"] + r * N * (k + 1) for r in range(R)]
            o_norm = o_norm_module(D, c["eps"], c["norm_w"], device)
            out = torch.empty(N * (k + 1), Hl, D, dtype=torch.bfloat16, device=device)
            for path in ("unfused", "kernel", *(f"split{sp}" for sp in splits)):
                if late(): res["skipped"].append({"requests": N, "drafts": k, "path": path}); continue
                if path == "unfused": fns = [lambda w=w: unfused_verify({**c, "rows": w}, kernels, o_norm) for w in rws]
                else:
                    sp = 1 if path == "kernel" else int(path[5:])
                    fns = [lambda w=w, sp=sp: kd.kda_verify_triton(**{**c, "rows": w}, out=out, v_split=sp) for w in rws]
                try: us = timer(fns, reps)
                except Exception as e:                                       # record, keep going
                    res["timings"].append({"requests": N, "drafts": k, "path": path, "error": f"{type(e).__name__}: {e}"[:400]})
                    continue
                rows[(N, k, path)] = r = {"requests": N, "drafts": k, "path": path, "rotations": R, "us": round(us, 2)}
                res["timings"].append(r); print(json.dumps(r), flush=True); save()
            u, kv, dec = rows.get((N, k, "unfused")), rows.get((N, k, "kernel")), rows.get((N, 0, "decode"))
            if u and kv:
                res.setdefault("ratios", {})[f"{N}x{k}"] = {
                    "unfused_us": u["us"], "kernel_us": kv["us"], "unfused_over_kernel": round(u["us"] / kv["us"], 2),
                    **({"decode_us": dec["us"], "kernel_over_decode": round(kv["us"] / dec["us"], 2)} if dec else {})}
                sp_us = {str(sp): rows[(N, k, f"split{sp}")]["us"] for sp in splits if (N, k, f"split{sp}") in rows}
                if sp_us:
                    best = min([("1", kv["us"]), *sp_us.items()], key=lambda x: x[1])
                    res["ratios"][f"{N}x{k}"].update(split_us=sp_us, best_split=int(best[0]), best_us=best[1],
                                                     unfused_over_best=round(u["us"] / best[1], 2))
            save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int_list, default=(1, 2, 4, 8))
    ap.add_argument("--drafts", type=int_list, default=(1, 3, 7), help="draft tokens a request verifies (k); each step verifies 1 + k")
    ap.add_argument("--splits", type=lambda v: int_list(v) if v else (), default=(2, 4, 8), help="the split forms to time beside the kernel (v_split; empty: none)")
    add_run_args(ap, reps=50, deadline_s=120.0)
    a = ap.parse_args(argv)
    outs = result_paths("kda_verify_h200", a.results_dir, a.out)
    if outs is None: return 2
    res = run(a.requests, a.drafts, a.reps, a.deadline_s, outs, splits=a.splits)
    for c in res["checks"]: print("check", json.dumps(c))
    for key, b in res.get("ratios", {}).items():
        print(f"{key}: unfused {b['unfused_us']} us, kernel {b['kernel_us']} us (x{b['unfused_over_kernel']}), "
              f"decode {b.get('decode_us')} us, kernel/decode {b.get('kernel_over_decode')}"
              + (f", splits {b['split_us']} us, best v_split {b['best_split']}" if "split_us" in b else ""))
    return 0 if gate(res) else 1

if __name__ == "__main__":
    sys.exit(main())
