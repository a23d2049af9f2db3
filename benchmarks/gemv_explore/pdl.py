"""Prototype: programmatic dependent launch (PDL) for the dependent GEMVs of a decode step.

    python benchmarks/gemv_explore/pdl.py [DEADLINE_S]

At one token a decode step is a chain of dependent kernels (about 650 on one TP2 rank, `r6c`'s trace in chapter 09),
and between two of them nothing overlaps: the next kernel's launch, the ramp of its first loads and the previous
kernel's tail add up. On Hopper a kernel launched with the programmatic-stream-serialization attribute (Triton:
`kernel[grid](..., launch_pdl=True)`) may start before the previous kernel in its stream has finished. It must run
`griddepcontrol.wait` (`gdc_wait`) before it reads what that kernel wrote (or writes what it reads); the previous
kernel lets it start early with `griddepcontrol.launch_dependents` (`gdc_launch_dependents`), else it starts as the
previous kernel's programs exit. A GEMV's weight does not depend on the previous kernel, so its first weight tile
can be loaded before the wait.

Chains of CHAIN dependent `[4,096, 4,096]` bf16 GEMVs (`o_proj`'s per-rank shape; y_i = W_i y_(i-1), a different
weight each, L2-cold), each chain one CUDA graph, microseconds per GEMV:

- `base`: plain launches, as the package launches its kernels;
- `pdl`: `launch_pdl`, `gdc_launch_dependents` at the start, `gdc_wait` before the first read of x;
- `pdl_prefetch`: as `pdl`, with the first weight tile loaded before the wait;
- each also with a plain (non-PDL) elementwise kernel between two GEMVs, as a norm or an activation sits between
  two projections in the engine: there only the GEMV's own launch can overlap;
- `package`: chapter 08i's `gemv` (its plan for this shape) in the same chain, for scale.

Every variant's chain output is first compared with `base`'s (bit-equal: the same arithmetic in the same order)
and `base`'s with the chain in fp32.

Output: benchmarks/gemv_explore/results/pdl.json (and $OUT/ when set).
"""
import json, os, sys, time
from pathlib import Path
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
from kernel_bench import result_head, time_graph          # noqa: E402
from solar_open2.nvfp4 import relative_rms                 # noqa: E402
try:
    from solar_open2.vllm import gemv as gm                # noqa: E402  (needs vLLM: the 'package' rows)
except ImportError:
    gm = None

PACKAGE_TILES = ((4, 1024, 4, 2), (4, 1024, 4, 3), (4, 1024, 4, 4), (8, 1024, 8, 3), (2, 2048, 4, 3))   # (BN, BK, warps, stages)
CHAIN = 12                                                 # dependent GEMVs per graph (a layer has 3 to 6)

@triton.jit
def gemv_pdl_kernel(x_ptr, w_ptr, y_ptr, N, K, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, PDL:tl.constexpr,
                    PREFETCH:tl.constexpr, LATE:tl.constexpr=False):
    "y[rows] = W[rows] · x for BLOCK_N rows, fp32 sums over BLOCK_K steps; PDL: wait for the previous kernel before x."
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    wp = w_ptr + rows[:, None] * K + ks[None, :]                                      # [BN, BK]
    if PDL and not LATE:
        gdc_launch_dependents()                            # the next kernel may start once every program got here
    if PREFETCH:
        w = tl.load(wp)                                    # the first weight tile: no dependence on the previous kernel
    if PDL:
        gdc_wait()                                         # x is the previous kernel's output
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if not PREFETCH:
            w = tl.load(wp + k0)
        x = tl.load(x_ptr + k0 + ks).to(tl.float32)                                     # [BK]
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if PREFETCH:
            w = tl.load(wp + k0 + BLOCK_K, mask=(k0 + BLOCK_K + ks)[None, :] < K, other=0.0)   # the next tile
    if PDL and LATE:
        gdc_launch_dependents()                            # LATE: only once the program's loads are done
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty))

def gemv_pdl(x, w, y, tile, pdl, prefetch, late=False):
    "One launch: x [K] -> y [N] (bf16), tile (BLOCK_N, BLOCK_K, num_warps)."
    bn, bk, nw = tile
    N, K = w.shape
    gemv_pdl_kernel[(N // bn,)](x, w, y, N, K, BLOCK_N=bn, BLOCK_K=bk, PDL=pdl, PREFETCH=prefetch, LATE=late, num_warps=nw,
                                launch_pdl=pdl)
    return y

def chain(ws, ys, step, between):
    "The CHAIN GEMVs y_i = step(y_(i-1), W_i), optionally with a plain elementwise kernel before each; returns the last y."
    x = ys[0]
    for i, w in enumerate(ws):
        if between: x = torch.mul(x, 1.0, out=ys[-1])       # a plain kernel the GEMV must wait for
        x = step(x, w, ys[1 + i % 2])
    return x

def chain_us(ws, ys, step, between=False)->float:
    "µs per GEMV of two CHAIN-long chains over the two halves of `ws` (other weights each: L2-cold), one CUDA graph."
    return time_graph([lambda h=h: chain(ws[h * CHAIN:(h + 1) * CHAIN], ys, step, between) for h in (0, 1)], 30) / CHAIN

def main():
    deadline = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    t0 = time.perf_counter()
    N = K = 4096
    res = {**result_head("gemv_explore_pdl", "cuda", ROOT), "shape": [N, K], "chain": CHAIN, "timings": [], "checks": []}
    outs = [ROOT / "benchmarks" / "gemv_explore" / "results" / "pdl.json"] + ([Path(os.environ["OUT"]) / "pdl.json"] if os.environ.get("OUT") else [])
    def save():
        for p in outs: p.parent.mkdir(parents=True, exist_ok=True); p.write_text(json.dumps(res, indent=1))
    g = torch.Generator().manual_seed(0)
    copies = 2 * CHAIN                                                         # 805 MB of weights: L2-cold
    ws = [(torch.randn(N, K, generator=g) / K ** 0.5).to(torch.bfloat16).cuda() for _ in range(copies)]
    x0 = torch.randn(K, generator=g).to(torch.bfloat16).cuda()
    ys = [x0.clone()] + [torch.empty(N, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
    ref = x0.double()
    for w in ws[:CHAIN]: ref = w.double() @ ref                                   # the chain in fp64
    tiles = ((8, 512, 4), (4, 1024, 4), (16, 256, 4), (8, 1024, 8))
    variants = {"base": (False, False, False), "pdl": (True, False, False), "pdl_prefetch": (True, True, False),
                "pdl_late": (True, False, True), "pdl_late_prefetch": (True, True, True)}
    step_for = lambda tile, pdl, pre, late: (lambda x, w, y: gemv_pdl(x, w, y, tile, pdl, pre, late))
    for tile in tiles:
        outs_v = {}
        for name, v in variants.items():
            ys[0].copy_(x0)
            outs_v[name] = chain(ws[:CHAIN], ys, step_for(tile, *v), False).clone()
        ok = {n: bool(torch.equal(o, outs_v["base"])) for n, o in outs_v.items()}
        rr = relative_rms(outs_v["base"].double().cpu(), ref.cpu())
        res["checks"].append({"tile": list(tile), "equal_to_base": ok, "base_rel_rms_fp64": rr, "pass": all(ok.values()) and rr < 3e-2})
        print(json.dumps(res["checks"][-1]), flush=True); save()
    for rep in (0, 1):                                                     # twice, to see the noise
        for between in (False, True):
            ys[0].copy_(x0)
            if gm is None:
                print("vLLM missing: no package rows", flush=True)
            else:
                us = chain_us(ws, ys, lambda x, w, y: gm.gemv(x[None], w)[0], between)
                r = {"variant": "package", "rep": rep, "between": between, "plan": str(gm.gemv_plan(1, N, K, torch.bfloat16)),
                     "us_per_gemv": round(us, 2)}
                res["timings"].append(r); print(json.dumps(r), flush=True); save()
                for pt in PACKAGE_TILES:                # 08i's FMA kernel at other tiles, in the same chain
                    us = chain_us(ws, ys, lambda x, w, y: gm.gemv_triton(x[None], w, "fma", pt)[0], between)
                    r = {"variant": "package_tile", "rep": rep, "between": between, "tile": list(pt), "us_per_gemv": round(us, 2)}
                    res["timings"].append(r); print(json.dumps(r), flush=True); save()
            for tile in tiles:
                for name, v in variants.items():
                    if time.perf_counter() - t0 > deadline: break
                    us = chain_us(ws, ys, step_for(tile, *v), between)
                    r = {"variant": name, "rep": rep, "between": between, "tile": list(tile), "us_per_gemv": round(us, 2)}
                    res["timings"].append(r); print(json.dumps(r), flush=True); save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1); save()

if __name__ == "__main__":
    main()
