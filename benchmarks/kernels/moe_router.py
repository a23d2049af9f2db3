#!/usr/bin/env python
"""The MoE routing kernel (`solar_open2.vllm.ops.moe_route`, chapter `08_ops/moe_route`) against the path it replaces, on one GPU.

    python -m benchmarks.kernels.moe_router [--tokens 1,2,4,8] [--tiles 1x4096x8x1,...]

Needs vLLM (its grouped top-k is half of the path being replaced), so on the GPU machine it runs after the staging
steps. The real router of one layer: `mlp.gate.weight` fp32 [320, 4096] (replicated on every rank),
`e_score_correction_bias` fp32 [320], top-8, renormalised, bf16 hidden states. It first checks, per token count:

- `route_triton` against `route_torch` (the definition, fp32): ids equal, largest weight difference;
- `route_triton` against vLLM's path: ids equal (the logits are summed in another order, so a near-tie may flip: the
  number of differing selections is recorded with the selection-score gap at the 8th/9th place).

Then it times, each in one CUDA graph over `copies` weight copies (more than 200 MB, so the weights come from HBM as
in the engine, where every layer reads its own router):

- `vllm`: what the engine ran before chapter 08k: `x.float()`, chapter 08i's GEMV on the fp32 weight (its
  `GEMV_TILES` plan; cuBLAS where it has none) and vLLM's `grouped_topk` (its fused CUDA kernel on the GPU);
- `kernel`: `route_triton` with each tile of `--tiles` (default: `ROUTE_TILES`' row for the token count).

Output: `benchmarks/results/incoming/moe_router_h200.json` (and `$OUT/` when set), written after every timing.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

from benchmarks.common import ROOT, add_run_args, int_list, json_writer, result_head, result_paths, tile_list, time_graph
from solar_open2.config import SolarOpen2Config

L2_BYTES = 200e6

def real_shapes(cfg:SolarOpen2Config)->dict:
    "The router of one layer: E experts, K hidden, top_k."
    return dict(E=cfg.n_routed_experts, K=cfg.hidden_size, top_k=cfg.num_experts_per_tok)

def vllm_path(x, w, bias, top_k:int):
    "The path before chapter 08k: fp32 cast, 08i's GEMV (cuBLAS where its table has no plan), vLLM's grouped top-k."
    from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import grouped_topk
    from solar_open2.vllm.ops.gemv import gemv
    z = gemv(x.float(), w)                                                    # [T, E] fp32
    return grouped_topk(x, z, top_k, True, num_expert_group=1, topk_group=1, scoring_func="sigmoid",
                        routed_scaling_factor=1.0, e_score_correction_bias=bias)

GATE_RULE = "the routing kernel's ids, weights, pairs and counters equal the torch path's (checks_pass)"

def gate(res:dict)->bool:
    "The sanity gate: the checks ran and passed."
    return res.get("checks_pass") is True

def run(tokens=(1, 2, 4, 8), tiles=None, reps:int=50, deadline_s:float=90.0, out_paths=(), device:str="cuda",
        shapes:dict|None=None, timer=None, l2_bytes:float=L2_BYTES, max_copies:int=64, pairs:bool=False, small_checks:bool=True)->dict:
    """Check, then per token count time vLLM's path and the kernel over its tiles; returns the result dict (also
    written to `out_paths`). `small_checks`: run the chapter's small cases (`self_check`) first (default).
    `device`, `shapes`, `timer` exist for the CPU test."""
    import torch
    from solar_open2.vllm.ops import moe_route as mr
    t0 = time.perf_counter()
    shp, timer = dict(shapes or real_shapes(SolarOpen2Config.real())), timer or time_graph
    E, K, k = shp["E"], shp["K"], shp["top_k"]
    res = {**result_head("moe_router_h200", device, ROOT), "shapes": shp, "checks": [], "timings": [], "skipped": [], "best": {}}
    save = json_writer(res, out_paths, gate, GATE_RULE)
    res["small_checks"] = mr.self_check(device=device) if small_checks else []
    g = torch.Generator(device=device).manual_seed(0)
    nbytes = 4 * E * K                                                        # fp32 weights read per call
    copies = max(1, min(max_copies, int(-(-l2_bytes // nbytes))))
    W = [torch.randn(E, K, generator=g, device=device) / K ** 0.5 for _ in range(copies)]
    B = [0.05 * torch.randn(E, generator=g, device=device) for _ in range(copies)]
    counters = [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(copies)]
    for T in tokens:                                                          # real shapes, against fp32 and vLLM
        x = torch.randn(T, K, generator=g, device=device).to(torch.bfloat16)
        wt, it = mr.route_triton(x, W[0], B[0], k, counter=counters[0])
        wr, ir = mr.route_torch(x, W[0], B[0], k)
        wv, iv = vllm_path(x, W[0], B[0], k)
        c = torch.sort(torch.sigmoid(x.float() @ W[0].T) + B[0], -1, descending=True).values   # [T, E] selection scores
        ot, ov = torch.sort(it.long(), -1), torch.sort(iv.long(), -1)        # the same experts in id order
        same = torch.equal(ot.values, ov.values)
        res["checks"].append({"tokens": T, "ids_equal_torch": bool(torch.equal(it, ir)),
                              "max_dw_torch": (wt - wr).abs().max().item(), "ids_equal_vllm": same,
                              "max_dw_vllm": (wt.gather(1, ot.indices) - wv.float().gather(1, ov.indices)).abs().max().item()
                                             if same else None,
                              "min_gap_k": (c[:, k - 1] - c[:, k]).min().item(), "counter": int(counters[0].item())})
    if pairs:                                                                 # the pairs beside the routing: 08f's, bit for bit
        from solar_open2.vllm.ops.nvfp4_dot import act_pairs_triton
        for T in tokens:
            x = torch.randn(T, K, generator=g, device=device).to(torch.bfloat16)
            pb = mr.pairs_buffers(T, K, device)
            mr.route_triton(x, W[0], B[0], k, counter=counters[0], pairs_out=pb)
            P, V = act_pairs_triton(x)
            res["checks"].append({"tokens": T, "kind": "pairs", "pairs_equal": bool(torch.equal(pb[0], P) and torch.equal(pb[1], V)),
                                  "counter": int(counters[0].item())})
    res["checks_pass"] = (all(c["ids_equal"] and c["max_dw"] < 1e-6 and c["counter"] == 0 for c in res["small_checks"])
                          and all(c.get("pairs_equal", c.get("ids_equal_torch") and c.get("max_dw_torch", 1) < 1e-5)
                                  and c["counter"] == 0 for c in res["checks"]))
    save()
    late = lambda: time.perf_counter() - t0 > deadline_s
    def row(T, kind, tile, us):
        rr = {"tokens": T, "kernel": kind, "tile": tile, "us": round(us, 2), "bytes": nbytes, "copies": copies,
              "TBps": round(nbytes / us / 1e6, 3)}
        res["timings"].append(rr); print(json.dumps(rr), flush=True); save(); return rr
    for T in tokens:
        xs = [torch.randn(T, K, generator=g, device=device).to(torch.bfloat16) for _ in range(copies)]
        best = {}
        if late(): res["skipped"].append({"tokens": T, "kernel": "vllm"}); continue
        best["vllm"] = row(T, "vllm", None, timer([lambda x=x, w=w, b=b: vllm_path(x, w, b, k) for x, w, b in zip(xs, W, B)], reps))
        for tile in (tiles or (mr.route_tile_for(T),)):
            if late(): res["skipped"].append({"tokens": T, "kernel": "kernel", "tile": list(tile)}); continue
            fns = [lambda x=x, w=w, b=b, c=c: mr.route_triton(x, w, b, k, counter=c, tile=tile)
                   for x, w, b, c in zip(xs, W, B, counters)]
            try: rr = row(T, "kernel", list(tile), timer(fns, reps))
            except Exception as e:                                           # record, keep going
                res["timings"].append({"tokens": T, "kernel": "kernel", "tile": list(tile), "error": f"{type(e).__name__}: {e}"[:400]})
                continue
            if "kernel" not in best or rr["us"] < best["kernel"]["us"]: best["kernel"] = rr
        if "kernel" in best: best["speedup"] = round(best["vllm"]["us"] / best["kernel"]["us"], 3)
        if pairs and "kernel" in best and not late():                      # + the activation pairs (solar_open2_moe_pairs)
            tile = tuple(best["kernel"]["tile"])
            bufs = [mr.pairs_buffers(T, K, device) for _ in range(copies)]
            best["kernel_pairs"] = row(T, "kernel+pairs", list(tile), timer(
                [lambda x=x, w=w, b=b, c=c, pb=pb: mr.route_triton(x, w, b, k, counter=c, tile=tile, pairs_out=pb)
                 for x, w, b, c, pb in zip(xs, W, B, counters, bufs)], reps))
        res["best"][str(T)] = best
        save()
    res["counters_zero"] = all(int(c.item()) == 0 for c in counters)          # every replay left its counter reset
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=(1, 2, 4, 8))
    ap.add_argument("--tiles", type=tile_list, default=None, help="BLOCK_NxBLOCK_KxWARPSxSTAGES,... (default: ROUTE_TILES)")
    ap.add_argument("--pairs", action="store_true", help="also check and time the kernel writing the activation pairs")
    add_run_args(ap, reps=50, deadline_s=90.0)
    a = ap.parse_args(argv)
    outs = result_paths("moe_router_h200", a.results_dir, a.out)
    if outs is None: return 2
    res = run(a.tokens, a.tiles, a.reps, a.deadline_s, outs, pairs=a.pairs)
    for c in res["checks"]: print("check", c)
    for T, b in res["best"].items():
        if "kernel" in b:
            print(f"{T} token(s): vllm path {b['vllm']['us']} us, kernel {b['kernel']['us']} us at {b['kernel']['tile']}: {b['speedup']}x")
    return 0 if res["checks_pass"] and res["counters_zero"] else 1

if __name__ == "__main__":
    sys.exit(main())
