"""Prototype: which part of chapter 08i's FMA GEMV body costs the 1.1 µs that `pdl.py` found at one token.

    python benchmarks/gemv_explore/fma_body.py [DEADLINE_S]

`pdl.py` (one H200, 2026-12-01) timed a plain two-dimensional GEMV kernel (no masks, the loop pipelined at Triton's
default 3 stages) at 10.5 µs for a `[4,096, 4,096]` bf16 weight at one token, tile 4 rows x 1,024, 4 warps, and
08i's `gemv_fma_kernel` (08h's `gemv_block`: a `[BLOCK_T, BLOCK_N, BLOCK_K]` product summed over K, masks on tokens,
rows and K) at 11.6 µs on the same tile in the same chain. That is `o_proj`'s shape, 48 calls a decode step on the
critical path. The variants here change one thing at a time, all in `fma_variant_kernel`:

- `THREE_D`: the product as 08h's `[1, BN, BK]` broadcast summed over axis 2 (else `[BN, BK]` summed over axis 1);
- `MASKS`: the loads masked on rows and K as 08h's (else unmasked: the shape divides the tile);
- `STAGES`: the K loop's `tl.range(num_stages=...)`.

Each variant's output is compared with 08i's (`gemv_triton`, the same tile) and with the fp64 product. Chains of 12
dependent GEMVs, each its own weight (L2-cold), one CUDA graph; two repetitions.

Output: benchmarks/gemv_explore/results/fma_body.json (and $OUT/ when set).
"""
import json, os, sys, time
from pathlib import Path
import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gemv_explore"))
from kernel_bench import result_head                       # noqa: E402
from pdl import CHAIN, chain_us                            # noqa: E402  (the same chains of 12 GEMVs, timed the same way)
from solar_open2.nvfp4 import relative_rms                 # noqa: E402
from solar_open2.vllm import gemv as gm                    # noqa: E402

@triton.jit
def fma_variant_kernel(x_ptr, w_ptr, y_ptr, N, K, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, STAGES:tl.constexpr,
                       THREE_D:tl.constexpr, MASKS:tl.constexpr):
    "y[rows] = W[rows] · x, one token, fp32 sums; the body's form chosen by the constexprs."
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)                   # [BN]
    ks = tl.arange(0, BLOCK_K)                                                  # [BK]
    if THREE_D: acc = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    else: acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        kk = k0 + ks
        if MASKS:
            x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)                                     # [BK]
            w = tl.load(w_ptr + rows[:, None] * K + kk[None, :], mask=(rows[:, None] < N) & (kk[None, :] < K),
                        other=0.0).to(tl.float32)                                                            # [BN, BK]
        else:
            x = tl.load(x_ptr + kk).to(tl.float32)
            w = tl.load(w_ptr + rows[:, None] * K + kk[None, :]).to(tl.float32)
        if THREE_D: acc += tl.sum(x[None, None, :] * w[None, :, :], axis=2)    # [1, BN, BK] -> [1, BN]
        else: acc += tl.sum(w * x[None, :], axis=1)                             # [BN, BK] -> [BN]
    if THREE_D: tl.store(y_ptr + rows[None, :], acc.to(y_ptr.dtype.element_ty), mask=rows[None, :] < N)
    else: tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=rows < N)

def fma_variant(x, w, y, tile, stages, three_d, masks):
    bn, bk, nw = tile
    N, K = w.shape
    fma_variant_kernel[(triton.cdiv(N, bn),)](x, w, y, N, K, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, THREE_D=three_d,
                                              MASKS=masks, num_warps=nw)
    return y

VARIANTS = {   # name: (stages, three_d, masks)
    "2d": (3, False, False), "2d_s2": (2, False, False), "2d_masks": (3, False, True), "2d_masks_s2": (2, False, True),
    "2d_s1": (1, False, False), "2d_masks_s1": (1, False, True),
    "3d": (3, True, False), "3d_s2": (2, True, False), "3d_masks": (3, True, True), "3d_masks_s2": (2, True, True),
}
TILES = ((4, 1024, 4), (2, 2048, 4), (2, 2048, 8), (1, 4096, 4))

def main():
    deadline = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    t0 = time.perf_counter()
    N = K = 4096
    res = {**result_head("gemv_explore_fma_body", "cuda", ROOT), "shape": [N, K], "chain": CHAIN, "variants": VARIANTS,
           "timings": [], "checks": []}
    outs = [ROOT / "benchmarks" / "gemv_explore" / "results" / "fma_body.json"] + ([Path(os.environ["OUT"]) / "fma_body.json"] if os.environ.get("OUT") else [])
    def save():
        for p in outs: p.parent.mkdir(parents=True, exist_ok=True); p.write_text(json.dumps(res, indent=1))
    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(N, K, generator=g) / K ** 0.5).to(torch.bfloat16).cuda() for _ in range(2 * CHAIN)]
    x0 = torch.randn(K, generator=g).to(torch.bfloat16).cuda()
    ys = [x0.clone()] + [torch.empty(N, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    one = lambda x, w, y, tile, v: fma_variant(x, w, y, tile, *v)
    pkg = lambda tile: (lambda x, w, y: gm.gemv_triton(x[None], w, "fma", tile + (2,))[0])
    for tile in TILES:                                   # one GEMV, every variant against 08i's kernel at the tile
        ref = gm.gemv_triton(x0[None], ws[0], "fma", tile + (2,))[0]
        exact = ws[0].double() @ x0.double()
        for name, v in VARIANTS.items():
            y = one(x0, ws[0], torch.empty_like(x0), tile, v)
            c = {"tile": list(tile), "variant": name, "equal_to_package": bool(torch.equal(y, ref)),
                 "rel_rms_fp64": relative_rms(y.double().cpu(), exact.cpu()), "package_rel_rms_fp64": relative_rms(ref.double().cpu(), exact.cpu())}
            c["pass"] = c["rel_rms_fp64"] < 5e-3
            res["checks"].append(c); print(json.dumps(c), flush=True)
    save()
    for rep in (0, 1):
        us = chain_us(ws, ys, lambda x, w, y: gm.gemv(x[None], w)[0])
        r = {"variant": "plan", "rep": rep, "plan": str(gm.gemv_plan(1, N, K, torch.bfloat16)), "us_per_gemv": round(us, 2)}
        res["timings"].append(r); print(json.dumps(r), flush=True)
        for tile in TILES:
            us = chain_us(ws, ys, pkg(tile))
            r = {"variant": "package", "rep": rep, "tile": list(tile) + [2], "us_per_gemv": round(us, 2)}
            res["timings"].append(r); print(json.dumps(r), flush=True)
            for name, v in VARIANTS.items():
                if time.perf_counter() - t0 > deadline: break
                us = chain_us(ws, ys, lambda x, w, y: one(x, w, y, tile, v))
                r = {"variant": name, "rep": rep, "tile": list(tile), "us_per_gemv": round(us, 2)}
                res["timings"].append(r); print(json.dumps(r), flush=True)
            save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1); save()

if __name__ == "__main__":
    main()
