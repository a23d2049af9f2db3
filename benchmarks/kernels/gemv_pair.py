#!/usr/bin/env python
"""Two projections of one input in one launch (chapter 08i's `gemv_pair_triton`) against the two calls the engine makes now, on one GPU.

    python -m benchmarks.kernels.gemv_pair [--tokens 1,2,4,8] [--pairs gqa,kda] [--tiles0 mma:32x256x4x3,...] [--tiles1 same,fma:4x1024x2,...]

The pairs, at their real per-rank shapes at TP2 (bf16, K = 4,096):
* `gqa`: an attention layer's `qkv_proj` [5,120, 4,096] and `g_proj` [4,096, 4,096] (the output gate), both of the
  normed layer input; the engine runs cuBLAS for the first (its shape is not in `GEMV_TILES`) and 08i's FMA GEMV for
  the second;
* `kda`: a KDA layer's `qkvb_proj` [12,320, 4,096] and `fg_a_proj` [256, 4,096] (chapter 08j's gates mode; also timed
  in context by `kda_inproj_h200.py`).

Per pair and token count: `separate`, the two calls as `gemv` makes them (the `GEMV_TILES` plan, else cuBLAS); then
`gemv_pair_triton` for every (W0 tile, W1 tile) of `--tiles0` x `--tiles1`. A W0 tile is KIND:BLOCK_NxBLOCK_KxWARPS[xSTAGES],
a W1 tile KIND:BLOCK_NxBLOCK_K[xSTAGES] at the launch's warps, or `same` (W0's). Each variant is checked first, on
its first weight copy, against the fp32 product (relative RMS, as 08i's `checks_pass`: no further than 1.5x
`F.linear`'s distance plus 1e-3), then timed: the calls on enough weight copies to pass 200 MB (so every read comes
from HBM, as in the engine) in one CUDA graph, replayed.

Output: `benchmarks/results/incoming/gemv_pair_h200.json` (and `$OUT/` when set), written after every timing.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

from benchmarks.common import ROOT, add_run_args, int_list, json_writer, kind_tiles0, kind_tiles1, result_head, result_paths, time_graph
from solar_open2.config import SolarOpen2Config

TP = 2
L2_BYTES = 200e6
TILES0 = (("mma", (32, 256, 4, 3)), ("mma", (64, 256, 4, 3)), ("fma", (4, 1024, 4, 2)), ("fma", (2, 2048, 4, 2)))
TILES1 = (None, ("mma", (32, 256, 3)), ("fma", (4, 1024, 2)), ("fma", (2, 2048, 2)), ("fma", (4, 2048, 2)))

def pair_shapes(cfg:SolarOpen2Config, tp:int=TP)->dict:
    "name -> (what, N0, N1, K) per rank."
    D, H = cfg.head_dim, cfg.hidden_size
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) // tp * D
    P = cfg.kda_num_heads * cfg.kda_head_dim // tp
    return {"gqa": ("gqa.qkv_proj + gqa.g_proj", qkv, cfg.num_attention_heads // tp * D, H),
            "kda": ("kda.qkvb_proj + kda.fg_a_proj", 3 * P + cfg.kda_num_heads // tp, 2 * cfg.kda_head_dim, H)}

PAIRS = pair_shapes(SolarOpen2Config.real())

def pair_list(s:str)->tuple:
    names = tuple(s.split(","))
    if not names or any(n not in PAIRS for n in names): raise argparse.ArgumentTypeError(f"pairs are {sorted(PAIRS)}, got {s!r}")
    return names

def label(t0, t1)->str:
    return f"{t0[0]} {'x'.join(map(str, t0[1]))}" + (f" + W1 {t1[0]} {'x'.join(map(str, t1[1]))}" if t1 else "")

GATE_RULE = "every pair-GEMV tile checked against the fp32 product first (08i's checks_pass bound)"

def gate(res:dict)->bool:
    "The sanity gate: checks ran and every one passed."
    return bool(res["checks"]) and all(c["pass"] for c in res["checks"])

def run(tokens=(1, 2, 4, 8), pairs=("gqa", "kda"), tiles0=TILES0, tiles1=TILES1, reps:int=30, deadline_s:float=200.0,
        out_paths=(), device:str="cuda", shapes:dict|None=None, timer=None, l2_bytes:float=L2_BYTES, max_copies:int=16,
        dtype:str="bfloat16")->dict:
    """Per pair and token count: the two calls, then the pair kernel per tile combination, checked, then timed.
    `device`, `shapes`, `timer`, `l2_bytes`, `max_copies` and `dtype` exist for the CPU test."""
    import torch
    import torch.nn.functional as F
    from solar_open2.nvfp4 import relative_rms
    from solar_open2.vllm.ops import gemv as gm
    t0 = time.perf_counter()
    shapes, timer = dict(shapes or PAIRS), timer or time_graph
    dt = getattr(torch, dtype)
    res = {**result_head("gemv_pair_h200", device, ROOT), "pairs": {n: shapes[n] for n in pairs}, "dtype": dtype, "checks": [],
           "timings": [], "skipped": []}
    save = json_writer(res, out_paths, gate, GATE_RULE)
    late = lambda: time.perf_counter() - t0 > deadline_s
    for name in pairs:
        what, N0, N1, K = shapes[name]
        copies = max(2, min(max_copies, int(-(-l2_bytes // ((N0 + N1) * K * dt.itemsize)))))
        g = torch.Generator().manual_seed(0)
        ws = [tuple((torch.randn(n, K, generator=g) / K ** 0.5).to(dt).to(device) for n in (N0, N1)) for _ in range(copies)]
        for T in tokens:
            x = torch.randn(T, K, generator=g).to(dt).to(device)
            ref = [(x.float() @ w.float().T) for w in ws[0]]
            plain = [relative_rms(F.linear(x, w).float(), r) for w, r in zip(ws[0], ref)]
            variants = [("separate", None, None, lambda w: (gm.gemv(x, w[0]), gm.gemv(x, w[1])))]
            for a in tiles0:
                for b in tiles1:
                    if b is not None and b[0] == "fma" and T > gm.MAX_TOKENS: continue
                    variants.append(("pair", a, b, lambda w, a=a, b=b: gm.gemv_pair_triton(x, w[0], w[1], a[0], a[1], *(b or (None, None)))))
            rows = []
            for kind, a, b, f in variants:
                cfg = {"pair": name, "tokens": T, "path": kind if a is None else label(a, b)}
                if late(): res["skipped"].append(cfg); continue
                try:
                    got = f(ws[0])
                    rr = [relative_rms(y.float(), r) for y, r in zip(got, ref)]
                    ok = all(v <= 1.5 * p + 1e-3 for v, p in zip(rr, plain))
                    res["checks"].append({**cfg, "rel_rms": rr, "plain_rel_rms": plain, "pass": ok})
                    us = timer([lambda w=w: f(w) for w in ws], reps)
                except Exception as e:                                       # record, keep going
                    res["timings"].append({**cfg, "error": f"{type(e).__name__}: {e}"[:400]}); continue
                r = {**cfg, "copies": copies, "us": round(us, 2), "check": ok}
                rows.append(r); res["timings"].append(r); print(json.dumps(r), flush=True); save()
            sep = [r for r in rows if r["path"] == "separate"]
            pr = [r for r in rows if r["path"] != "separate" and r["check"]]
            if sep and pr:
                best = min(pr, key=lambda r: r["us"])
                res.setdefault("best", {}).setdefault(name, {})[str(T)] = {
                    "separate_us": sep[0]["us"], "pair_us": best["us"], "tiles": best["path"],
                    "separate_over_pair": round(sep[0]["us"] / best["us"], 2)}
            save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=(1, 2, 4, 8))
    ap.add_argument("--pairs", type=pair_list, default=tuple(PAIRS))
    ap.add_argument("--tiles0", type=kind_tiles0, default=TILES0, help="W0 tiles: KIND:NxKxWARPS[xSTAGES], comma-separated")
    ap.add_argument("--tiles1", type=kind_tiles1, default=TILES1, help="W1 tiles: same or KIND:NxK[xSTAGES], comma-separated")
    add_run_args(ap, reps=30, deadline_s=200.0)
    a = ap.parse_args(argv)
    outs = result_paths("gemv_pair_h200", a.results_dir, a.out)
    if outs is None: return 2
    res = run(a.tokens, a.pairs, a.tiles0, a.tiles1, a.reps, a.deadline_s, outs)
    for name, per in res.get("best", {}).items():
        for T, b in per.items():
            print(f"{name}, {T} token(s): separate {b['separate_us']} us, pair {b['pair_us']} us ({b['tiles']}), x{b['separate_over_pair']}")
    return 0 if all(c["pass"] for c in res["checks"]) else 1

if __name__ == "__main__":
    sys.exit(main())
