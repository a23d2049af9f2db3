"""Prototype: chapter 08i's tensor-core GEMV with the reduction split over SPLIT programs per row block, for the
[4,096, 4,096] `o_proj` (both mixers, 48 a decode step), against the package's plan for it.

    python benchmarks/gemv_explore/splitk.py [DEADLINE_S]

Alone, `o_proj` reaches about 2.8 TB/s at one token (11.8 µs): 128 to 256 programs each stream 128-256 KB, too few
loads in flight. Paired with `qkv_proj` in one grid, the same weight shape streamed at 3.5 TB/s (08i's pair GEMV).
Here each row block's K range is split over SPLIT programs; each writes its fp32 partial sums to a scratch buffer,
and the last of them to finish (an acquire-release counter per row block, as chapter 08k's routing kernel) adds the
partials in a fixed order, stores the output and resets the counter. Checked against `F.linear` in fp32 first.

Output: benchmarks/gemv_explore/results/splitk.json (and $OUT/ when set).
"""
import json, os, sys, time
from pathlib import Path
import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
from kernel_bench import result_head, time_graph          # noqa: E402
from solar_open2.nvfp4 import relative_rms                 # noqa: E402
from solar_open2.vllm import gemv as gm                    # noqa: E402

@triton.jit
def splitk_kernel(x_ptr, w_ptr, y_ptr, part_ptr, cnt_ptr, T, N, K, stride_xt, stride_wn, stride_yt,
                  SPLIT:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, NUM_STAGES:tl.constexpr):
    pid, sk = tl.program_id(0), tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    KS = K // SPLIT
    k_lo = sk * KS
    ks = tl.arange(0, BLOCK_K)
    ts = tl.arange(0, 16)
    acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, KS, BLOCK_K, num_stages=NUM_STAGES):
        kk = k_lo + k0 + ks
        x = tl.load(x_ptr + ts[:, None] * stride_xt + kk[None, :], mask=ts[:, None] < T, other=0.0)   # [16, BK]
        w = tl.load(w_ptr + rows[:, None] * stride_wn + kk[None, :], mask=rows[:, None] < N, other=0.0)   # [BN, BK]
        acc += tl.dot(x, tl.trans(w))
    pp = part_ptr + (sk * 16 + ts[:, None]) * N + rows[None, :]                 # [SPLIT, 16, N] fp32 scratch
    tl.store(pp, acc, mask=(ts[:, None] < T) & (rows[None, :] < N))
    tl.debug_barrier()
    prev = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
    if prev == SPLIT - 1:                                                      # the last of this row block's programs
        tot = tl.zeros([16, BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            tot += tl.load(part_ptr + (s * 16 + ts[:, None]) * N + rows[None, :], mask=(ts[:, None] < T) & (rows[None, :] < N), other=0.0)
        tl.store(y_ptr + ts[:, None] * stride_yt + rows[None, :], tot.to(y_ptr.dtype.element_ty), mask=(ts[:, None] < T) & (rows[None, :] < N))
        tl.atomic_xchg(cnt_ptr + pid, 0)

def splitk(x, w, y, part, cnt, split, bn, bk, nw, ns):
    T, K = x.shape; N = w.shape[0]
    splitk_kernel[(triton.cdiv(N, bn), split)](x, w, y, part, cnt, T, N, K, x.stride(0), w.stride(0), y.stride(0),
        SPLIT=split, BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=ns, num_warps=nw)
    return y

def main():
    deadline = float(sys.argv[1]) if len(sys.argv) > 1 else 90.0
    t0 = time.perf_counter()
    N = K = 4096
    res = {**result_head("gemv_explore_splitk", "cuda", ROOT), "shape": [N, K], "timings": [], "checks": []}
    outs = [ROOT / "benchmarks" / "gemv_explore" / "results" / "splitk.json"] + ([Path(os.environ["OUT"]) / "splitk.json"] if os.environ.get("OUT") else [])
    def save():
        for p in outs: p.parent.mkdir(parents=True, exist_ok=True); p.write_text(json.dumps(res, indent=1))
    g = torch.Generator().manual_seed(0)
    copies = 8                                                                 # 268 MB of weights: L2-cold
    ws = [(torch.randn(N, K, generator=g) / K ** 0.5).to(torch.bfloat16).cuda() for _ in range(copies)]
    part = torch.zeros(8 * 16 * N, dtype=torch.float32, device="cuda")
    configs = [(s, bn, bk, nw, ns) for s in (2, 4) for (bn, bk, nw, ns) in ((32, 256, 4, 3), (16, 256, 4, 3), (64, 256, 4, 3), (16, 512, 4, 3))]
    for T in (1, 2, 4, 8):
        x = torch.randn(T, K, generator=g).to(torch.bfloat16).cuda()
        y = torch.empty(T, N, dtype=torch.bfloat16, device="cuda")
        ref = (x.float() @ ws[0].float().T)
        plain = relative_rms(torch.nn.functional.linear(x, ws[0]).float(), ref)
        us = time_graph([lambda w=w: gm.gemv(x, w) for w in ws], 50)
        r = {"tokens": T, "path": "package gemv", "plan": str(gm.gemv_plan(T, N, K, torch.bfloat16)), "us": round(us, 2)}
        res["timings"].append(r); print(json.dumps(r), flush=True)
        for (s, bn, bk, nw, ns) in configs:
            if time.perf_counter() - t0 > deadline: break
            cnt = torch.zeros(triton.cdiv(N, bn), dtype=torch.int32, device="cuda")
            got = splitk(x, ws[0], y, part, cnt, s, bn, bk, nw, ns).float()
            rr = relative_rms(got, ref)
            ok = rr <= 1.5 * plain + 1e-3 and int(cnt.sum()) == 0
            res["checks"].append({"tokens": T, "split": s, "tile": [bn, bk, nw, ns], "rel_rms": rr, "plain": plain, "pass": ok})
            us = time_graph([lambda w=w: splitk(x, w, y, part, cnt, s, bn, bk, nw, ns) for w in ws], 50)
            r = {"tokens": T, "path": "splitk", "split": s, "tile": [bn, bk, nw, ns], "us": round(us, 2), "check": ok,
                 "counters_zero": int(cnt.sum()) == 0}
            res["timings"].append(r); print(json.dumps(r), flush=True); save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1); save()

if __name__ == "__main__":
    main()
