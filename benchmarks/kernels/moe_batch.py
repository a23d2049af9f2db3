#!/usr/bin/env python
"""One MoE layer's routed experts at the real per-rank shapes, from one token to a prefill chunk: which path, over which
weight layout, is fastest at each token count (issue 28: one MoE path, fastest at every batch size).

    python -m benchmarks.kernels.moe_batch [--tokens 1,2,4,8,16,32,64,128,512,8192] [--tiles BMxBNxBKxWARPSxSTAGES,...]
                                           [--marlin-tiles GxKTxWxS/GxKTxWxS,...]

Paths, each checked against the plain fp32 version (`moe_decode_torch`, on the first `CHECK_TOKENS` tokens) before any
of its timings counts:
- `marlin`: vLLM's Marlin W4A16 MoE, the NVFP4 backend vLLM picks on Hopper, over its own copy of the weights
  (`prepare_nvfp4_moe_layer_for_marlin`: the codes' nibbles permuted into Marlin's tiles, the E4M3 block scales
  re-encoded; the same bytes as the checkpoint's layout, a second layout if the raw one is also kept);
- `grouped_default`: vLLM's NVFP4 emulation kernel (`fused_moe_nvfp4_emulation_kernel`: tokens sorted by expert, each
  weight tile decoded from the raw layout and fed to `tl.dot`) as the plugin's `TritonNVFP4Experts.apply_grouped` runs
  it today above 8 tokens: gate and up launched apart, vLLM's default config for the token count (no tuned file exists
  for 320 experts) and Triton's default warps and stages (vLLM's launcher passes none);
- `grouped` with a tile `BMxBNxBKxWARPSxSTAGES`: the same kernel, gate and up in one launch (one global scale per
  expert, as Marlin needs too), the tile's block sizes, warps and stages;
- `decode`: the plugin's batch-1 kernels (`moe_decode_triton`, chapter 08_ops/moe_decode), up to 8 tokens;
- `marlin_decode` with a tile pair `GxKTxWARPSxSTAGES[xFORM]/GxKTxWARPSxSTAGES[xFORM]` (gate_up/down; FORM one of `FORMS`): the batch-1 kernels that read
  Marlin's copy (`moe_marlin_triton`, chapter 08_ops/moe_marlin), up to 8 tokens, over the very tensors vLLM's
  `prepare_nvfp4_moe_layer_for_marlin` wrote (`from_vllm`): its check holds the chapter's layout to vLLM's repack.

Each timing captures the path's launches in a CUDA graph (`benchmarks.common.time_graph`), over `--rotations` routings
so that consecutive calls select other experts. Reported per (tokens, path): microseconds, distinct experts read, the
bytes of their codes and scales, and the fraction of the GPU's bandwidth (H100 3.35 TB/s, H200 4.8 TB/s) and, for the
FLOPs, of its dense BF16 peak. Needs vLLM (Marlin's repack and kernel, the emulation kernel, `moe_align_block_size`):
run it after the staging steps; the shapes fit an H100.

Output: `benchmarks/results/incoming/moe_batch.json` (and `$OUT/` when set), written after every timing; its gate
withholds the summary (`best`) when a path's check failed.
"""
from __future__ import annotations
import argparse, json, time

from benchmarks.common import ROOT, add_run_args, gated_view, int_list, json_writer, result_head, result_paths, tile_list, time_graph
from benchmarks.kernels.moe_decode import REAL, expert_bytes, routing

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 512, 8192)
# BLOCK_M x BLOCK_N x BLOCK_K x warps x stages: small M blocks for decode batches (a few tokens per expert), large for prefill
TILES = ((16, 64, 128, 4, 3), (16, 128, 128, 4, 3), (16, 64, 256, 4, 4), (16, 128, 256, 8, 3), (32, 64, 128, 4, 3),
         (64, 128, 64, 4, 3), (64, 128, 128, 8, 3), (128, 128, 64, 8, 3), (64, 256, 64, 8, 3), (128, 256, 64, 8, 3))
# gate_up / down tiles of the Marlin-layout decode kernels (column groups of 8, tile rows per step, warps, stages)
_G0, _D0 = (1, 64, 4, 2), (2, 4, 4, 2)    # one side held while the other varies, so each kernel's best can be read apart
MARLIN_TILES = (tuple((g, _D0) for g in ((1, 32, 4, 2), (1, 64, 4, 2), (1, 64, 8, 2), (1, 128, 8, 2), (2, 32, 4, 2), (1, 64, 4, 3),
                                          (2, 16, 4, 2), (1, 32, 4, 3)))
                + tuple((_G0, d) for d in ((1, 8, 4, 2), (2, 8, 4, 2), (4, 4, 4, 2), (4, 8, 8, 2), (2, 4, 4, 3), (8, 4, 8, 2), (1, 4, 4, 2)))
                # packed fp16 (a fifth field 4: `MarlinTile.half2`): gate/up with down held, then both; the word-scale form
                # (3) lost at every count on 2026-12-07 (moe_batch_h100_even.json) and is no longer swept
                + tuple((g + (4,), _D0) for g in ((1, 64, 4, 2), (2, 16, 4, 2), (1, 32, 4, 2), (2, 32, 4, 2), (1, 32, 4, 3), (4, 16, 4, 2)))
                + tuple((g + (4,), d + (4,)) for g, d in (((1, 64, 4, 2), (1, 8, 4, 2)), ((1, 64, 4, 2), (2, 8, 4, 2)),
                                                          ((2, 16, 4, 2), (2, 4, 4, 2)), ((1, 32, 4, 2), (4, 4, 4, 2)))))

FORMS = {2: "the broadcast loop, scales per column (also no fifth field)", 3: "scale bytes per word (word_scales)",
         4: "packed fp16 (half2)"}   # the results of 2026-12-07 also record 0 and 1, forms since removed

def marlin_tile(t:tuple):
    "A `MarlinTile` from (groups, k_tiles, warps, stages[, form]), the form one of `FORMS`."
    from solar_open2.vllm.ops.moe_marlin import MarlinTile
    if len(t) == 5 and t[4] not in FORMS: raise ValueError(f"a Marlin tile's fifth field is its form, one of {sorted(FORMS)} (0, 1: removed forms), got {t}")
    form = t[4] if len(t) == 5 else 2
    return MarlinTile(*t[:4], word_scales=form == 3, half2=form == 4)

CHECK_TOKENS = 4          # rows compared with the fp32 version (every path computes each token's row on its own)
CHECK_LIMIT = 1e-2        # relative RMS: bf16 operands and a bf16 intermediate give ~4e-3; a wrong scale or layout gives ~1
GATE_RULE = (f"every path's output on its first {CHECK_TOKENS} tokens is within {CHECK_LIMIT} relative RMS of the plain "
             "fp32 version (moe_decode_torch) at every token count timed, and finite")


def shared_global_scale(w13):
    "`w13` with the up rows' global scale set to the gate rows' (one scale per expert, what Marlin and one launch need)."
    from solar_open2.vllm.ops.moe_decode import NVFP4Experts
    g = w13.global_scale[:, :1].expand(-1, 2).contiguous()                 # [E, 2] gate's, twice
    return NVFP4Experts(w13.packed, w13.scale, g)

def align_torch(topk_ids, block_m:int, E:int):
    """`moe_align_block_size` in plain torch (for the CPU test): (token-pair ids sorted by expert, each expert's run padded
    to `block_m` with the pad id M*k, the expert of each block, the padded length as a 1-element tensor)."""
    import torch
    flat = topk_ids.flatten().long()
    pad, ids, experts = flat.numel(), [], []
    for e in range(E):
        rows = (flat == e).nonzero().flatten().tolist()
        if not rows: continue
        n = -(-len(rows) // block_m) * block_m
        ids += rows + [pad] * (n - len(rows)); experts += [e] * (n // block_m)
    dev = topk_ids.device
    return (torch.tensor(ids, dtype=torch.int32, device=dev), torch.tensor(experts, dtype=torch.int32, device=dev),
            torch.tensor([len(ids)], dtype=torch.int32, device=dev))

def align_vllm(topk_ids, block_m:int, E:int):
    "vLLM's `moe_align_block_size` (CUDA), as the engine's experts call it."
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
    return moe_align_block_size(topk_ids, block_m, E, None)

def launch(A, B, C, scale, gscale, weights, sorted_ids, expert_ids, n_padded, mul_weight:bool, top_k:int, cfg:dict):
    """vLLM's `fused_moe_nvfp4_emulation_kernel` on `A` [M, K] (bf16; fp32 under Triton's interpreter, which has no bf16 dot) and the raw NVFP4 `B` [E, N, K/2] (`scale` [E, N, K/16]
    E4M3, `gscale` [E] multipliers) into `C` [M, top_k, N], with `cfg`'s block sizes and, unlike vLLM's launcher,
    its `num_warps` and `num_stages` when given."""
    import triton
    from triton import language as tl
    from vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe import fused_moe_nvfp4_emulation_kernel
    import torch
    N, K, M = B.size(1), A.size(1), A.size(0)
    scale = scale if scale.dtype == torch.uint8 else scale.view(torch.uint8)   # the kernel bitcasts bytes to E4M3
    EM = sorted_ids.size(0)
    if M < cfg["BLOCK_SIZE_M"]: EM = min(EM, M * top_k * cfg["BLOCK_SIZE_M"])     # vLLM's bound on the live blocks
    grid = (triton.cdiv(EM, cfg["BLOCK_SIZE_M"]) * triton.cdiv(N, cfg["BLOCK_SIZE_N"]),)
    extra = {k: cfg[k] for k in ("num_warps", "num_stages") if k in cfg}
    compute = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[A.dtype]
    fused_moe_nvfp4_emulation_kernel[grid](
        A, B, C, scale, gscale, weights, sorted_ids, expert_ids, n_padded, N, K, EM, M * top_k,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(1), C.stride(2),   # B as [E, K/2, N]
        scale.stride(0), scale.stride(2), scale.stride(1), block_k_diviable=K % cfg["BLOCK_SIZE_K"] == 0,
        MUL_ROUTED_WEIGHT=mul_weight, top_k=top_k, compute_type=compute, group_size=16,
        BLOCK_SIZE_M=cfg["BLOCK_SIZE_M"], BLOCK_SIZE_N=cfg["BLOCK_SIZE_N"], BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"],
        GROUP_SIZE_M=cfg.get("GROUP_SIZE_M", 1), **extra)

def grouped(x, ids, wts, w13, w2, cfg:dict, align=align_vllm, split_w13:bool=False):
    """The routed experts of `x` [M, K] through the emulation kernel over the raw layout: sort the (token, expert) pairs by
    expert, gate|up (one launch, or two with `split_w13`: each with its own global scale, as the plugin does today),
    SiLU·mul, down weighted by the routing weights, sum over the k experts. Returns [M, H] in `x`'s dtype."""
    import torch
    import torch.nn.functional as F
    M, K = x.shape
    E, N, _ = w13.packed.shape
    I, H, k = N // 2, w2.packed.shape[1], ids.shape[1]
    sorted_ids, expert_ids, n_padded = align(ids, cfg["BLOCK_SIZE_M"], E)
    h13 = torch.empty(M, k, N, device=x.device, dtype=x.dtype)                # [M, k, 2I] gate | up
    if split_w13:
        for seg in (0, 1):
            rows = slice(seg * I, (seg + 1) * I)
            launch(x, w13.packed[:, rows], h13[:, :, rows], w13.scale[:, rows], w13.global_scale[:, seg].contiguous(), None,
                   sorted_ids, expert_ids, n_padded, False, k, cfg)
    else:
        launch(x, w13.packed, h13, w13.scale, w13.global_scale[:, 0].contiguous(), None, sorted_ids, expert_ids, n_padded,
               False, k, cfg)
    h = (F.silu(h13[..., :I].float()) * h13[..., I:].float()).to(x.dtype).view(M * k, I)   # [M·k, I]
    y = torch.empty(M, k, H, device=x.device, dtype=x.dtype)                  # [M, k, H] per expert, weighted
    launch(h, w2.packed, y, w2.scale, w2.global_scale[:, 0].contiguous(), wts, sorted_ids, expert_ids, n_padded, True, 1, cfg)
    return y.sum(1)                                                            # [M, H]

def default_config(M:int, w13, w2, k:int)->dict:
    "The config vLLM's emulation experts use for `M` tokens (its lookup over the packed shapes; Triton's warps and stages)."
    from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config
    c = try_get_optimal_moe_config(tuple(w13.packed.shape), tuple(w2.packed.shape), k, None, M, block_shape=None)
    return {key: c[key] for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")}

class Marlin:
    "vLLM's Marlin NVFP4 MoE over its repacked copy of `w13`, `w2` (one global scale per expert for gate|up)."
    def __init__(self, w13, w2):
        import torch
        from types import SimpleNamespace
        from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import prepare_nvfp4_moe_layer_for_marlin
        E, N, K = w13.shape
        layer = SimpleNamespace(num_experts=E, hidden_size=K, intermediate_size_per_partition=N // 2, params_dtype=torch.bfloat16)
        (self.w1, self.s1, self.g1, self.w2, self.s2, self.g2) = prepare_nvfp4_moe_layer_for_marlin(
            layer, w13.packed, w13.scale, w13.global_scale[:, 0].contiguous(), w2.packed, w2.scale,
            w2.global_scale[:, 0].contiguous(), is_act_and_mul=True)
        self.workspace, self.E, self.I = layer.workspace, E, N // 2
        self.bytes = sum(t.numel() * t.element_size() for t in (self.w1, self.s1, self.w2, self.s2))

    def __call__(self, x, ids, wts):
        from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
        from vllm.scalar_type import scalar_types
        return fused_marlin_moe(x, self.w1, self.w2, None, None, self.s1, self.s2, wts, ids,
                                quant_type_id=scalar_types.float4_e2m1f.id, global_num_experts=self.E,
                                global_scale1=self.g1, global_scale2=self.g2, workspace=self.workspace)

def check(got, ref)->dict:
    "Relative RMS of `got` against `ref` (the fp32 version), and whether it is finite."
    import torch
    from solar_open2 import nvfp4
    return {"rel_rms": float(nvfp4.relative_rms(got.float(), ref)), "finite": bool(torch.isfinite(got).all())}

def gate(res:dict)->bool:
    "Every check ran finite and within `CHECK_LIMIT`, and there is at least one."
    return bool(res["checks"]) and all(c["finite"] and c["rel_rms"] < CHECK_LIMIT for c in res["checks"])

def run(tokens=TOKENS, tiles=TILES, reps:int=20, deadline_s:float=240.0, out_paths=(), device:str="cuda",
        shapes:dict|None=None, timer=None, rotations:int=4, align=None, marlin:bool=True, decode:bool=True,
        default_cfg=None, dtype=None, marlin_tiles=MARLIN_TILES)->dict:
    """Per token count: check then time each path (`marlin`, `grouped_default`, `grouped` per tile, `decode` up to 8
    tokens); returns the result (also written to `out_paths` after every timing). `device`, `shapes`, `timer`, `align`,
    `marlin`, `decode`, `default_cfg` and `dtype` (of the activations, default bf16) exist for the CPU test (Triton's
    interpreter, a plain-torch align, a fake timer, no Marlin, a fixed default config, fp32)."""
    import torch
    from solar_open2.vllm.ops import moe_decode as md
    from benchmarks.kernels.moe_decode import random_experts
    t0 = time.perf_counter()
    shp, timer, align, default_cfg = dict(shapes or REAL), timer or time_graph, align or align_vllm, default_cfg or default_config
    E, K, I, H, k = (shp[x] for x in ("E", "K", "I", "H", "topk"))
    res = {**result_head("moe_batch", device, ROOT, schema=1), "shapes": shp, "rotations": rotations, "tiles": [list(t) for t in tiles],
           "check_tokens": CHECK_TOKENS, "check_limit": CHECK_LIMIT, "checks": [], "timings": [], "skipped": [], "errors": []}
    from benchmarks.engine.perf.figures import gpu_peaks
    bw, flops_peak, _ = gpu_peaks(res["gpu"])
    res["peaks"] = {"bandwidth_Bps": bw, "bf16_flops": flops_peak}
    save = json_writer(res, out_paths, gate, GATE_RULE)
    w13, w2 = random_experts(E, K, I, H, device)
    w13 = shared_global_scale(w13)
    per = expert_bytes(I, K, H)
    res["raw_bytes"] = sum(t.numel() * t.element_size() for t in (w13.packed, w13.scale, w2.packed, w2.scale))
    mar = None
    res["marlin_tiles"] = [[list(g), list(d)] for g, d in marlin_tiles]
    if marlin:
        from solar_open2.vllm.ops import moe_marlin as mm
        mar = Marlin(w13, w2)
        res["marlin_bytes"] = mar.bytes                                           # its copy: the same bytes, another layout
        m13, m2 = mm.from_vllm(mar.w1, mar.s1, mar.g1, torch.bfloat16), mm.from_vllm(mar.w2, mar.s2, mar.g2, torch.bfloat16)
    late = lambda: time.perf_counter() - t0 > deadline_s
    res["best"] = {}
    for M in tokens:
        xs = [torch.randn(M, K, device=device).to(dtype or torch.bfloat16) for _ in range(rotations)]
        rts = [routing(M, E, k, device, seed=1000 * M + r) for r in range(rotations)]
        rts = [(i.to(torch.int32).contiguous(), w) for i, w in rts]
        distinct = sum(int(torch.unique(i).numel()) for i, _ in rts) / rotations
        nbytes = distinct * (per["w13"] + per["w2"])
        flops = 2 * M * k * (2 * I * K + H * I)
        c = min(CHECK_TOKENS, M)
        ref = md.moe_decode_torch(xs[0][:c], rts[0][0][:c], rts[0][1][:c], w13, w2)   # [c, H] fp32
        paths = []
        if mar is not None: paths.append(("marlin", None, lambda x, i, w: mar(x, i, w)))
        cfg0 = default_cfg(M, w13, w2, k)
        paths.append(("grouped_default", cfg0, lambda x, i, w, cfg=cfg0: grouped(x, i, w, w13, w2, cfg, align, split_w13=True)))
        for t in tiles:
            cfg = dict(zip(("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps", "num_stages"), t))
            paths.append(("grouped", cfg, lambda x, i, w, cfg=cfg: grouped(x, i, w, w13, w2, cfg, align)))
        if decode and M <= 8: paths.append(("decode", None, lambda x, i, w: md.moe_decode_triton(x, i, w, w13, w2)))
        if mar is not None and M <= 8:
            for tg, td in marlin_tiles:
                t = (marlin_tile(tg), marlin_tile(td))
                paths.append(("marlin_decode", {"gate_up": list(tg), "down": list(td)},
                              lambda x, i, w, t=t: mm.moe_marlin_triton(x, i, w, m13, m2, mar.I, gate_up=t[0], down=t[1])))
        best = {}
        for name, cfg, fn in paths:
            if late(): res["skipped"].append({"tokens": M, "path": name, "config": cfg}); continue
            try:
                got = fn(xs[0], *rts[0])[:c]
                res["checks"].append({"tokens": M, "path": name, "config": cfg, **check(got, ref)})
                us = timer([lambda x=x, r=r: fn(x, *r) for x, r in zip(xs, rts)], reps if M < 1024 else max(3, reps // 4))
            except Exception as e:                                            # a tile that does not compile: record, go on
                res["errors"].append({"tokens": M, "path": name, "config": cfg, "error": f"{type(e).__name__}: {e}"[:400]})
                save(); continue
            r = {"tokens": M, "path": name, "config": cfg, "us": round(us, 2), "distinct_experts": distinct,
                 "bytes": round(nbytes), "fraction_of_bandwidth": round(nbytes / (us * 1e-6) / bw, 3),
                 "tflops": round(flops / (us * 1e-6) / 1e12, 1), "fraction_of_bf16_peak": round(flops / (us * 1e-6) / flops_peak, 3)}
            res["timings"].append(r); print(json.dumps(r), flush=True); save()
            if name not in best or r["us"] < best[name]["us"]: best[name] = r
        if "marlin" in best:
            for b in best.values(): b["marlin_over_this"] = round(best["marlin"]["us"] / b["us"], 3)
        res["best"][str(M)] = best
        save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def marlin_rows(res:dict)->list:
    "The `MARLIN_TILES` rows a result measured: (tokens, gate_up, down) of the fastest `marlin_decode` pair per token count, gate passed only."
    if not res.get("gate", {}).get("passed"): raise ValueError("moe_batch: the result's gate did not pass; its timings are not a table")
    rows = [(int(M), marlin_tile(tuple(b["marlin_decode"]["config"]["gate_up"])), marlin_tile(tuple(b["marlin_decode"]["config"]["down"])))
            for M, b in res.get("best", {}).items() if "marlin_decode" in b]
    return sorted(rows, key=lambda r: r[0])

def rows_literal(rows:list)->str:
    "`marlin_rows` as the Python literal of `MARLIN_TILES`' rows (MarlinTile's repr)."
    return "(" + "".join(f"({M}, {g!r}, {d!r}), " for M, g, d in rows) + ")"

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=TOKENS)
    ap.add_argument("--tiles", type=tile_list, default=TILES, help="BLOCK_MxBLOCK_NxBLOCK_KxWARPSxSTAGES,... for the grouped kernel")
    ap.add_argument("--marlin-tiles", type=lambda v: tuple(tuple(tuple(int(n) for n in t.split("x")) for t in pair.split("/"))
                                                           for pair in v.split(",")), default=MARLIN_TILES,
                    help=f"GxKTxWARPSxSTAGES[xFORM]/...,... gate_up/down tiles of the Marlin-layout decode kernels (FORM {FORMS})")
    ap.add_argument("--rotations", type=int, default=4, help="routings per graph (other experts on each call)")
    add_run_args(ap, reps=20, deadline_s=240.0)
    a = ap.parse_args(argv)
    bad = [t for t in a.tiles if len(t) != 5]
    if bad: ap.error(f"--tiles: each tile is BLOCK_MxBLOCK_NxBLOCK_KxWARPSxSTAGES (5 numbers), got {bad}")
    def bad_pair(p):
        if len(p) != 2 or any(len(t) not in (4, 5) for t in p): return True
        try: [marlin_tile(t) for t in p]
        except ValueError: return True
        return False
    bad = [p for p in a.marlin_tiles if bad_pair(p)]
    if bad: ap.error(f"--marlin-tiles: each entry is GxKTxWARPSxSTAGES[xFORM]/GxKTxWARPSxSTAGES[xFORM] (gate_up/down; FORM {FORMS}), got {bad}")
    outs = result_paths("moe_batch", a.results_dir, a.out)
    if outs is None: return 2
    res = gated_view(run(a.tokens, a.tiles, a.reps, a.deadline_s, outs, rotations=a.rotations, marlin_tiles=a.marlin_tiles),
                     gate, GATE_RULE)                                   # what the file holds: the gate's verdict, figures withheld on failure
    for c in res["checks"]:
        if not (c["finite"] and c["rel_rms"] < CHECK_LIMIT): print("CHECK FAILED", c)
    for M, b in res.get("best", {}).items():
        print(M, "tokens:", ", ".join(f"{p} {r['us']} us ({r.get('config')}; marlin/this {r.get('marlin_over_this')})" for p, r in b.items()))
    if res.get("gate", {}).get("passed") and any("marlin_decode" in b for b in res["best"].values()):
        print("MARLIN_TILES rows measured:", rows_literal(marlin_rows(res)))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
