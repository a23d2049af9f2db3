#!/usr/bin/env python
"""The batch-1 NVFP4 MoE kernels (`solar_open2.vllm.ops.moe_decode`, chapter `08_ops/moe_decode`) at the real per-rank shapes on one GPU.

    python -m benchmarks.kernels.moe_decode [--tokens 1,2,4,8] [--gate-up-tiles 2x512x4x3,...] [--down-tiles 16x128x4x3,...]

Needs only torch and triton (no vLLM), so it runs on the GPU machine without the staging steps. One layer's routed
experts at TP2: 320 experts, hidden 4096, intermediate 640 per rank (1280 / 2), random E2M1 codes, FP8 block scales
and global scales. It first checks the kernels against the plain fp32 version on the GPU (the chapter's small cases,
then one real-shape token), then, for each token count and tile, captures the two launches in a CUDA graph (as the
engine replays them) and times replays with CUDA events. Reported: microseconds per call, and the bandwidth reached
on the expert bytes actually read (packed codes + block scales of the distinct selected experts; 8 per token).

Marlin is not run here (it needs vLLM's weight repacking); the comparison figures are chapter 09's profile of the
engine (`benchmarks/results/archive/2026-11-30/perf_h200_graphs_ar.json`), recorded in the JSON as `marlin_profile`. The claim that
matters is an engine A/B once the kernels are wired in; this script decides whether that is worth doing.

Output: `benchmarks/results/incoming/moe_decode_h200.json` (and `$OUT/` when set), written after every configuration.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

from benchmarks.common import ROOT, add_run_args, int_list, json_writer, result_head, result_paths, tile_list, time_graph
from solar_open2 import budget
from solar_open2.config import SolarOpen2Config, nvfp4_bytes

TP = 2

def rank_shapes(cfg:SolarOpen2Config, tp:int=TP)->dict:
    "One layer's routed experts on one rank: every expert, its intermediate width split over `tp` (vLLM's TP MoE)."
    return dict(E=cfg.n_routed_experts, K=cfg.hidden_size, I=cfg.moe_intermediate_size // tp, H=cfg.hidden_size,
                topk=cfg.num_experts_per_tok)

REAL = rank_shapes(SolarOpen2Config.real())                    # 320 experts, 4096 -> 640 -> 4096, top-8
H200_BANDWIDTH = budget.BANDWIDTH["h200"]
# chapter 09, `ar` profile (2x H200, TP2, one stream, CUDA graphs): per MoE layer, microseconds
MARLIN_PROFILE = {"source": "benchmarks/results/archive/2026-11-30/perf_h200_graphs_ar.json (top_kernels, per layer)",
                  "gate_up_marlin_us": 16.7, "down_marlin_us": 11.8, "two_gemms_us": 28.5,
                  "with_align_sort_fill_act_sum_copy_us": 40.8}

def expert_bytes(I:int, K:int, H:int)->dict:
    "Bytes the kernels read for one expert (the codec's count: codes, block scales, global scale): gate + up, down."
    return {"w13": 2 * nvfp4_bytes(I, K), "w2": nvfp4_bytes(H, I)}

def random_experts(E, K, I, H, device, seed=0):
    "Random NVFP4 experts at the given shapes, built on `device` (every code valid, scales finite and positive)."
    import torch
    from solar_open2.vllm.ops.moe_decode import NVFP4Experts
    g = torch.Generator(device=device).manual_seed(seed)
    def one(N, Kin, S):
        packed = torch.randint(0, 256, (E, N, Kin // 2), generator=g, device=device, dtype=torch.uint8)
        scale = (0.25 + torch.rand(E, N, Kin // 16, generator=g, device=device, dtype=torch.float32)).to(torch.float8_e4m3fn)
        gs = (1e-2 * (0.5 + torch.rand(E, S, generator=g, device=device, dtype=torch.float32))).float()
        return NVFP4Experts(packed, scale, gs)
    return one(2 * I, K, 2), one(H, I, 1)

def routing(M, E, k, device, seed=0):
    "Distinct experts per token (as top-k routing gives) and positive weights."
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).to(device)
    wts = torch.softmax(torch.randn(M, k, generator=g, dtype=torch.float32), -1).to(device)
    return ids, wts

# (block_n, block_k, warps, stages, words, half2): the word decode's best tiles as controls, then the half2 decode's
GATE_UP_TILES = ((1, 1024, 4, 2, 1), (1, 512, 2, 2, 1),
                 (1, 1024, 4, 2, 1, 1), (1, 2048, 4, 2, 1, 1), (2, 1024, 4, 2, 1, 1), (1, 1024, 2, 2, 1, 1),
                 (2, 512, 4, 3, 1, 1), (1, 512, 2, 2, 1, 1), (4, 512, 4, 2, 1, 1), (1, 1024, 8, 2, 1, 1), (1, 2048, 8, 2, 1, 1))
DOWN_TILES = ((16, 128, 4, 3, 1), (32, 128, 4, 3, 1),
              (16, 128, 4, 3, 1, 1), (32, 128, 4, 3, 1, 1), (16, 128, 2, 3, 1, 1), (8, 128, 4, 3, 1, 1),
              (16, 64, 4, 3, 1, 1), (32, 128, 8, 3, 1, 1), (16, 128, 4, 1, 1, 1), (64, 128, 8, 3, 1, 1))
READS = ("bytes", "words", "half2")

def check_ok(c:dict)->bool:
    """fp32 decodes (bytes, words) match the plain version to summation order; half2 accumulates 8 products per fp16 lane,
    so it must stay under 2e-3 and under the plain version's own error with `h` rounded to bf16 (what a bf16 kernel keeps)."""
    if c.get("read") == "half2": return c["rel_rms"] < 2e-3 and c["rel_rms"] < c["bf16_h_rel_rms"]
    return c["rel_rms"] < 1e-5

GATE_RULE = "every decode (bytes, words, half2) matches the plain fp32 version (check_ok) before anything is timed"

def gate(res:dict)->bool:
    "The sanity gate: checks ran and every one is `check_ok`."
    return bool(res["checks"]) and all(check_ok(c) for c in res["checks"])

def shared_expert_contention(M, gate_up_tiles, down:"md.Tile", xs, rts, w13, w2, reps, timer, late, dev, K, Is, row_cb=None)->list:
    """The routed kernels next to the shared expert on a second CUDA stream, as vLLM runs them (chapter 09's profile:
    the shared expert's cuBLAS GEMMs on stream 545 while `moe_gate_up_kernel` runs on stream 17, which then takes
    30.8 µs instead of 21). One row per gate/up tile: the routed pair alone, the shared expert alone
    (`gate_up` [2·Is, K] bf16, SiLU·mul, `down` [K, Is]), the two on one stream one after the other, and the two
    forked onto two streams inside the graph. A grid whose programs each run for the whole kernel leaves the
    programs that find their SM taken by the other stream waiting a full program's time; smaller programs (more of
    them) should lose less. `Is` is the shared expert's width on one rank."""
    import torch, torch.nn.functional as F
    from solar_open2.vllm.ops import moe_decode as md
    g = torch.Generator(device=dev).manual_seed(7)
    n = len(xs)
    wgu = [(torch.randn(2 * Is, K, generator=g, device=dev) / K ** 0.5).to(torch.bfloat16) for _ in range(n)]
    wd = [(torch.randn(K, Is, generator=g, device=dev) / Is ** 0.5).to(torch.bfloat16) for _ in range(n)]
    side = torch.cuda.Stream(device=dev) if dev == "cuda" else None
    def shared(i):
        gu = F.linear(xs[i], wgu[i])                                    # [M, 2·Is]
        a, b = gu.chunk(2, -1)                                          # [M, Is] each
        return F.linear(F.silu(a) * b, wd[i])                           # [M, K]
    def routed(i, t): return md.moe_decode_triton(xs[i], *rts[i], w13, w2, gate_up=t, down=down)
    def forked(i, t):
        if side is None: shared(i); routed(i, t); return                # the CPU test: no streams
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side): shared(i)
        routed(i, t)
        torch.cuda.current_stream().wait_stream(side)
    rows, shared_us = [], None
    for tile in gate_up_tiles:
        if late(): break
        t = md.Tile(*tile)
        try:
            if shared_us is None: shared_us = timer([lambda i=i: shared(i) for i in range(n)], reps)
            r = {"tokens": M, "gate_up_tile": list(tile), "down_tile": [down.block_n, down.block_k, down.num_warps, down.num_stages],
                 "routed_us": timer([lambda i=i: routed(i, t) for i in range(n)], reps), "shared_us": shared_us,
                 "serial_us": timer([lambda i=i: (shared(i), routed(i, t)) for i in range(n)], reps),
                 "two_streams_us": timer([lambda i=i: forked(i, t) for i in range(n)], reps)}
        except Exception as e:                                         # record, keep going
            rows.append({"tokens": M, "gate_up_tile": list(tile), "error": f"{type(e).__name__}: {e}"[:400]}); continue
        r = {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
        r["overlap_gain_us"] = round(r["serial_us"] - r["two_streams_us"], 2)      # > 0: the second stream helps
        r["contention_us"] = round(r["two_streams_us"] - max(r["routed_us"], r["shared_us"]), 2)   # 0: perfect overlap
        rows.append(r); print(json.dumps({"shared": r}), flush=True)
        if row_cb: row_cb()
    return rows

CONTENTION_TILES = ((1, 512, 4, 3), (2, 512, 4, 3), (1, 1024, 4, 3), (1, 256, 2, 3), (1, 512, 2, 3), (2, 512, 2, 3),
                    (4, 512, 4, 3), (1, 256, 4, 3))

def run(tokens=(1, 2, 4, 8), gate_up_tiles=GATE_UP_TILES, down_tiles=DOWN_TILES, reps:int=50, deadline_s:float=70.0,
        out_paths=(), device:str="cuda", shapes:dict|None=None, timer=None, rotations:int=8, shared:bool=False,
        shared_tiles=CONTENTION_TILES, small_reads=READS)->dict:
    """Check, then per token count time each kernel alone over its tiles and the two together with the best pair;
    returns the result dict (also written to `out_paths`). Tiles are (block_n, block_k, num_warps, num_stages[, words[, half2]]):
    a fifth field 1 selects the 32-bit word decode (`md.Tile.words`), a sixth the packed fp16 decode (`md.Tile.half2`).
    `small_reads`: the decodes whose small cases (the chapter's `self_check`) run first, all of them by default.
    `device`, `shapes` and `timer` exist for the CPU test of this script (Triton's interpreter, a fake timer)."""
    import torch, triton
    from solar_open2 import nvfp4
    from solar_open2.vllm.ops import moe_decode as md
    t0 = time.perf_counter()
    dev, shp, timer = device, dict(shapes or REAL), timer or time_graph
    res = {**result_head("moe_decode_h200", dev, ROOT, schema=2), "shapes": shp, "rotations": rotations,
           "bandwidth_Bps": H200_BANDWIDTH, "marlin_profile": MARLIN_PROFILE, "checks": [], "timings": [], "skipped": []}
    save = json_writer(res, out_paths, gate, GATE_RULE)
    res["checks"] = [{**c, "kind": "small"} for rd in small_reads for c in md.self_check(device=dev, read=rd)]
    E, K, I, H, k = (shp[x] for x in ("E", "K", "I", "H", "topk"))
    w13, w2 = random_experts(E, K, I, H, dev)
    x = torch.randn(1, K, device=dev, dtype=torch.float32).to(torch.bfloat16)
    ids, wts = routing(1, E, k, dev)
    ref = md.moe_decode_torch(x, ids, wts, w13, w2)
    ref16 = md.moe_decode_torch(x, ids, wts, w13, w2, h_dtype=torch.bfloat16)
    for rd in READS:
        kw = md.read_flags(rd)
        got = md.moe_decode_triton(x, ids, wts, w13, w2, gate_up=md.Tile(1, 1024, **kw), down=md.Tile(16, 128, **kw))
        res["checks"].append({"kind": "real shapes, 1 token", "case": [E, K, I, H, 1, k], "read": rd,
                              "rel_rms": nvfp4.relative_rms(got, ref), "bf16_h_rel_rms": nvfp4.relative_rms(ref16, ref)})
    save()
    per = expert_bytes(I, K, H)
    cdiv = lambda a, b: -(-a // b)
    late = lambda: time.perf_counter() - t0 > deadline_s
    res["best"] = {}
    for M in tokens:
        xs = [torch.randn(M, K, device=dev, dtype=torch.float32).to(torch.bfloat16) for _ in range(rotations)]
        rts = [routing(M, E, k, dev, seed=100 * M + r) for r in range(rotations)]
        ids32 = [r[0].to(torch.int32).contiguous() for r in rts]
        hs = [torch.randn(M * k, I, device=dev) for _ in range(rotations)]
        out = torch.empty(M, H, device=dev)
        distinct = sum(int(torch.unique(r[0]).numel()) for r in rts) / rotations
        b13, b2 = distinct * per["w13"], distinct * per["w2"]
        def row(kind, tile, us, nbytes):
            r = {"tokens": M, "kernel": kind, "tile": list(tile) if tile else None, "us": round(us, 2),
                 "distinct_experts": distinct, "bytes": round(nbytes), "TBps": round(nbytes / us / 1e6, 3),
                 "fraction_of_bandwidth": round(nbytes / us / 1e-6 / H200_BANDWIDTH, 3)}
            res["timings"].append(r); print(json.dumps(r), flush=True); save(); return r
        def gate_up(x, i, h, t:md.Tile):
            c = md.codes_for(w13, "w13", t.read)                        # uint8 [E, 2I, K/2], int32 [.., K/8] or int64 [.., K/16]
            md.moe_gate_up_kernel[(cdiv(I, t.block_n), M)](x, i, c, w13.scale, w13.global_scale, h, K, I, k,
                x.stride(0), c.stride(0), c.stride(1), w13.scale.stride(0), w13.scale.stride(1), h.stride(0),
                KP=triton.next_power_of_2(k), BLOCK_N=t.block_n, BLOCK_K=md.block_k_for(K, t.block_k), NUM_STAGES=t.num_stages,
                WORDS=t.words, HALF2=t.half2, ASM=not md.interpreting(), num_warps=t.num_warps)
        def down(h, i, w, t:md.Tile):
            c = md.codes_for(w2, "w2", t.read)
            md.moe_down_kernel[(cdiv(H, t.block_n), M)](h, i, w, c, w2.scale, w2.global_scale, out, I, H, k,
                h.stride(0), c.stride(0), c.stride(1), w2.scale.stride(0), w2.scale.stride(1), out.stride(0),
                KP=triton.next_power_of_2(k), BLOCK_N=t.block_n, BLOCK_K=md.block_k_for(I, t.block_k), NUM_STAGES=t.num_stages,
                WORDS=t.words, HALF2=t.half2, ASM=not md.interpreting(), num_warps=t.num_warps)
        best = {}
        for kind, tiles, nbytes in (("gate_up", gate_up_tiles, b13), ("down", down_tiles, b2)):
            for tile in tiles:
                if late(): res["skipped"].append({"tokens": M, "kernel": kind, "tile": list(tile)}); continue
                t = md.Tile(*tile)
                try:
                    fns = ([lambda x=x, i=i, h=h: gate_up(x, i, h, t) for x, i, h in zip(xs, ids32, hs)] if kind == "gate_up" else
                           [lambda h=h, i=i, w=r[1]: down(h, i, w, t) for h, i, r in zip(hs, ids32, rts)])
                    r = row(kind, tile, timer(fns, reps), nbytes)
                except Exception as e:                                   # record, keep going
                    res["timings"].append({"tokens": M, "kernel": kind, "tile": list(tile), "error": f"{type(e).__name__}: {e}"[:400]})
                    continue
                if kind not in best or r["us"] < best[kind]["us"]: best[kind] = r
        if len(best) == 2 and not late():
            g, d = (md.Tile(*best[kd]["tile"]) for kd in ("gate_up", "down"))
            fns = [lambda x=x, r=r: md.moe_decode_triton(x, *r, w13, w2, gate_up=g, down=d) for x, r in zip(xs, rts)]
            best["both"] = row("both", None, timer(fns, reps), b13 + b2)
            best["both"]["tiles"] = [list(best["gate_up"]["tile"]), list(best["down"]["tile"])]
        res["best"][str(M)] = best
        save()
        if shared and "down" in best:
            d = md.Tile(*best["down"]["tile"])
            res.setdefault("shared", []).extend(shared_expert_contention(
                M, shared_tiles, d, xs, rts, w13, w2, reps, timer, late, dev, K, I, row_cb=save))   # one shared expert, as wide as a routed one
            save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=(1, 2, 4, 8))
    ap.add_argument("--gate-up-tiles", type=tile_list, default=GATE_UP_TILES, help="BLOCK_NxBLOCK_KxWARPSxSTAGES[xWORDS[xHALF2]],...")
    ap.add_argument("--down-tiles", type=tile_list, default=DOWN_TILES, help="BLOCK_NxBLOCK_KxWARPSxSTAGES[xWORDS[xHALF2]],...")
    ap.add_argument("--rotations", type=int, default=8, help="routings per graph (distinct experts per replay)")
    ap.add_argument("--shared", action="store_true", help="also time the routed kernels next to the shared expert on a "
                    "second stream (vLLM's layout), over --shared-tiles gate/up tiles")
    ap.add_argument("--shared-tiles", type=tile_list, default=CONTENTION_TILES, help="BLOCK_NxBLOCK_KxWARPSxSTAGES[xWORDS],...")
    add_run_args(ap, reps=50, deadline_s=70.0)
    a = ap.parse_args(argv)
    outs = result_paths("moe_decode_h200", a.results_dir, a.out)
    if outs is None: return 2
    res = run(a.tokens, a.gate_up_tiles, a.down_tiles, a.reps, a.deadline_s, outs, rotations=a.rotations, shared=a.shared,
              shared_tiles=a.shared_tiles)
    for c in res["checks"]: print("check", c)
    for M, b in res["best"].items():
        for kd, r in b.items():
            print(f"{M} token(s) {kd}: {r['us']} us at {r.get('tiles') or r['tile']}, {r['TBps']} TB/s "
                  f"({100 * r['fraction_of_bandwidth']:.0f} % of 4.8)")
    for r in res.get("shared", []):
        if "error" not in r:
            print(f"{r['tokens']} token(s) next to the shared expert, gate/up {r['gate_up_tile']}: routed {r['routed_us']}, "
                  f"shared {r['shared_us']}, serial {r['serial_us']}, two streams {r['two_streams_us']} us")
    return 0 if gate(res) else 1

if __name__ == "__main__":
    sys.exit(main())
