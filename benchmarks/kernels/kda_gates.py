#!/usr/bin/env python
"""The KDA low-rank gates (`solar_open2.vllm.ops.kda_gates`, chapter `08_ops/kda_gates`) at the real per-rank shapes on one GPU.

    python -m benchmarks.kernels.kda_gates [--tokens 1,2,4,8] [--a-tiles 2x1024x4,...] [--b-tiles 32x128x4,...]

Needs only torch and triton: the plugin's kernels import no vLLM, so it runs on the GPU machine without the staging
steps (`--no-op` is accepted for older command lines and changes nothing). One KDA layer's gate weights on one rank at TP2: `fg_a_proj`
[256, 4096], `f_b_proj` and `g_b_proj` [4096, 128], bf16. It first checks the kernels on the GPU (chapter 08h's
cases in fp32 and bf16, then the real shapes), then, per token count, times:

- `cublas`: `kda_gates_torch`, the three `F.linear` calls of the module path (what the engine runs today);
- `a` and `b`: each kernel launch alone over its tiles;
- `triton`: both launches with the best pair, the figure to compare with `cublas`.

Each timing captures calls on different weight copies (more than 200 MB, so the weights come from HBM as in the
engine) in one CUDA graph and replays it. Output: `benchmarks/results/incoming/kda_gates_h200.json` (and `$OUT/` when set),
written after every timing.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

from benchmarks.common import ROOT, add_run_args, int_list, json_writer, plugin_module, result_head, result_paths, tile_list, time_graph
from solar_open2 import budget
from solar_open2.config import SolarOpen2Config
from solar_open2.nvfp4 import relative_rms

TP = 2
L2_BYTES = 200e6
A_TILES = ((1, 1024, 4), (1, 4096, 4), (1, 4096, 8), (1, 2048, 4), (2, 2048, 4), (1, 1024, 4, 3), (1, 512, 4, 4), (2, 1024, 4, 3), (2, 4096, 8))
B_TILES = ((16, 128, 2), (16, 128, 4), (32, 128, 4), (8, 128, 2), (32, 64, 4, 2), (4, 128, 1))

def real_shapes(cfg:SolarOpen2Config, tp:int=TP)->dict:
    "One KDA layer's gate GEMMs on one rank: d (hidden), r (rank), P (the gates' width on the rank)."
    return dict(d=cfg.hidden_size, r=cfg.kda_gate_rank, P=cfg.kda_num_heads * cfg.kda_head_dim // tp)

GATE_RULE = "chapter 08h's self-checks and the real-shape checks pass (checks_pass, its GPU bound)"

def gate(res:dict)->bool:
    "The sanity gate: the kernels' checks ran and passed."
    return res.get("checks_pass") is True

def run(tokens=(1, 2, 4, 8), a_tiles=A_TILES, b_tiles=B_TILES, reps:int=50, deadline_s:float=90.0, out_paths=(),
        device:str="cuda", shapes:dict|None=None, timer=None, l2_bytes:float=L2_BYTES, max_copies:int=64)->dict:
    """Check, then per token count time the module path, each launch over its tiles and the best pair; returns the
    result dict (also written to `out_paths`). `device`, `shapes`, `timer` exist for the CPU test."""
    import torch
    kg = plugin_module("kda_gates")
    t0 = time.perf_counter()
    shp, timer = dict(shapes or real_shapes(SolarOpen2Config.real())), timer or time_graph
    d, r, P = shp["d"], shp["r"], shp["P"]
    res = {**result_head("kda_gates_h200", device, ROOT), "tp": TP, "shapes": shp, "bandwidth_Bps": budget.BANDWIDTH["h200"],
           "checks": [], "timings": [], "skipped": [], "best": {}}
    save = json_writer(res, out_paths, gate, GATE_RULE)
    res["checks"] = [{**c, "kind": "small"} for c in kg.self_check(device=device)]
    g = torch.Generator(device=device).manual_seed(0)
    nbytes = 2 * (2 * r * d + 2 * P * r)                                       # bf16 weights read per call
    copies = max(1, min(max_copies, int(-(-l2_bytes // nbytes))))
    W = [tuple((torch.randn(*s, generator=g, device=device) / s[1] ** 0.5).to(torch.bfloat16)
               for s in ((2 * r, d), (P, r), (P, r))) for _ in range(copies)]
    for T in sorted({1, min(max(tokens), kg.MAX_TOKENS)}):                     # real shapes, bf16, against fp32
        x = torch.randn(T, d, generator=g, device=device).to(torch.bfloat16)
        wa, wfb, wgb = W[0]
        y = (x.float() @ wa.float().T).to(torch.bfloat16).float()
        ref = torch.cat([y[:, :r] @ wfb.float().T, y[:, r:] @ wgb.float().T], -1)
        got = torch.cat(kg.kda_gates_triton(x, wa, wfb, wgb), -1).float()
        plain = torch.cat(kg.kda_gates_torch(x, wa, wfb, wgb), -1).float()
        res["checks"].append({"kind": "real shapes", "case": [T, d, r, P], "dtype": "bfloat16",
                              "rel_rms": relative_rms(got, ref), "plain_rel_rms": relative_rms(plain, ref)})
    res["checks_pass"] = kg.checks_pass(res["checks"])                        # chapter 08h's GPU bound
    save()
    late = lambda: time.perf_counter() - t0 > deadline_s
    def row(T, kind, tile, us, nb):
        rr = {"tokens": T, "kernel": kind, "tile": tile, "us": round(us, 2), "bytes": nb, "copies": copies,
              "TBps": round(nb / us / 1e6, 3)}
        res["timings"].append(rr); print(json.dumps(rr), flush=True); save(); return rr
    a_bytes, b_bytes = 2 * 2 * r * d, 2 * 2 * P * r
    for T in tokens:
        if T > kg.MAX_TOKENS: res["skipped"].append({"tokens": T, "why": f"more than MAX_TOKENS={kg.MAX_TOKENS}"}); continue
        xs = [torch.randn(T, d, generator=g, device=device).to(torch.bfloat16) for _ in range(copies)]
        ys = [torch.randn(T, 2 * r, generator=g, device=device).to(torch.bfloat16) for _ in range(copies)]
        outs = [torch.empty(T, P, device=device, dtype=torch.bfloat16) for _ in range(2)]
        best = {}
        if late(): res["skipped"].append({"tokens": T, "kernel": "cublas"}); continue
        best["cublas"] = row(T, "cublas", None, timer([lambda x=x, w=w: kg.kda_gates_torch(x, *w) for x, w in zip(xs, W)], reps), nbytes)
        for kind, tiles, nb in (("a", a_tiles, a_bytes), ("b", b_tiles, b_bytes)):
            for tile in tiles:
                if late(): res["skipped"].append({"tokens": T, "kernel": kind, "tile": list(tile)}); continue
                if kind == "a": fns = [lambda x=x, w=w, y=y: kg.gemv_launch([(x, w[0], y)], T, 2 * r, d, tile) for x, w, y in zip(xs, W, ys)]
                else: fns = [lambda w=w, y=y: kg.gemv_launch([(y[:, :r], w[1], outs[0]), (y[:, r:], w[2], outs[1])], T, P, r, tile)
                             for w, y in zip(W, ys)]
                try: rr = row(T, kind, list(tile), timer(fns, reps), nb)
                except Exception as e:                                       # record, keep going
                    res["timings"].append({"tokens": T, "kernel": kind, "tile": list(tile), "error": f"{type(e).__name__}: {e}"[:400]})
                    continue
                if kind not in best or rr["us"] < best[kind]["us"]: best[kind] = rr
        if "a" in best and "b" in best and not late():
            tiles = (tuple(best["a"]["tile"]), tuple(best["b"]["tile"]))
            best["triton"] = row(T, "triton", [list(t) for t in tiles],
                                 timer([lambda x=x, w=w: kg.kda_gates_triton(x, *w, tiles=tiles) for x, w in zip(xs, W)], reps), nbytes)
            best["speedup"] = round(best["cublas"]["us"] / best["triton"]["us"], 3)
        res["best"][str(T)] = best
        save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=(1, 2, 4, 8))
    ap.add_argument("--a-tiles", type=tile_list, default=A_TILES, help="BLOCK_NxBLOCK_KxWARPS,... for fg_a_proj")
    ap.add_argument("--b-tiles", type=tile_list, default=B_TILES, help="BLOCK_NxBLOCK_KxWARPS,... for f_b_proj + g_b_proj")
    add_run_args(ap, reps=50, deadline_s=90.0, no_op=True)
    a = ap.parse_args(argv)
    outs = result_paths("kda_gates_h200", a.results_dir, a.out)
    if outs is None: return 2
    res = run(a.tokens, a.a_tiles, a.b_tiles, a.reps, a.deadline_s, outs)
    for c in res["checks"]: print("check", c)
    for T, b in res["best"].items():
        if "triton" in b:
            print(f"{T} token(s): cublas {b['cublas']['us']} us, triton {b['triton']['us']} us at {b['triton']['tile']} "
                  f"(a {b['a']['us']}, b {b['b']['us']}): {b['speedup']}x")
    return 0 if gate(res) else 1

if __name__ == "__main__":
    sys.exit(main())
