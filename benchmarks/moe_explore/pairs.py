"""A prototype, not used by the package: chapter 08f's half2 gate/up kernel with the activation pairs computed once
per token by a small kernel before it, instead of in every program's K loop.

Why: the half2 decode's SASS has about 8.6 instructions per byte of codes at one token, and `act_pairs` (16 loads, 15
max, 16 multiplies and 8 conversions per 16-input block) is recomputed by every one of the 640 programs, which all read
the same token. Precomputed, each block's pairs are 8 uint32 and one fp32 (planar: `[M, 8, K/16]` and `[M, K/16]`),
loaded per block. Chapter 08k's routing kernel reads the whole token too, so it could write the pairs at no extra
launch; here the prologue is its own launch and is timed apart.

    python benchmarks/moe_explore/pairs.py [DEADLINE_S]     (one GPU, torch + triton only; from the repository root)

Checks the prototype's h against 08f's half2 kernel (same arithmetic: they must agree to a few ulps) and the plain
fp32 version, then times, per token count, each in one CUDA graph over 8 routings and token vectors (L2-cold
experts): 08f's word and half2 gate/up with `TILES`' tile, the prologue alone, and the prototype over a few tiles
with and without the prologue. Output: `results/pairs.json` next to this file (and `$OUT/pairs.json` when set).
"""
import json, os, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import torch, triton
import triton.language as tl
from kernel_bench import time_graph
from moe_decode_h200 import REAL, random_experts, routing
from solar_open2.nvfp4 import relative_rms
import solar_open2.vllm.moe_decode as md

@triton.jit
def act_pairs_kernel(x_ptr, p_ptr, inv_ptr, NB, stride_xm, BLOCK_B:tl.constexpr, ASM:tl.constexpr):
    "Grid (M, blocks / BLOCK_B): `act_pairs` of BLOCK_B 16-input blocks of token m, stored planar."
    m, pid = tl.program_id(0), tl.program_id(1)
    b = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    bm = b < NB
    X0, X1, X2, X3, X4, X5, X6, X7, inv = md.act_pairs(x_ptr + m * stride_xm + 16 * b, bm, ASM)
    pp = p_ptr + m * 8 * NB + b
    tl.store(pp, X0, mask=bm); tl.store(pp + NB, X1, mask=bm); tl.store(pp + 2 * NB, X2, mask=bm); tl.store(pp + 3 * NB, X3, mask=bm)
    tl.store(pp + 4 * NB, X4, mask=bm); tl.store(pp + 5 * NB, X5, mask=bm); tl.store(pp + 6 * NB, X6, mask=bm); tl.store(pp + 7 * NB, X7, mask=bm)
    tl.store(inv_ptr + m * NB + b, inv, mask=bm)

@triton.jit
def gate_up_pairs_kernel(p_ptr, inv_ptr, ids_ptr, w_ptr, s_ptr, g_ptr, h_ptr, K, I, topk,
                         stride_we, stride_wn, stride_se, stride_sn, stride_hm,
                         KP:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, NUM_STAGES:tl.constexpr, ASM:tl.constexpr):
    "08f's `moe_gate_up_kernel` HALF2 branch with the pairs loaded instead of computed."
    pid_n, m = tl.program_id(0), tl.program_id(1)
    NB = K // 16
    j = tl.arange(0, KP)
    jm = j < topk
    e = tl.load(ids_ptr + m * topk + j, mask=jm, other=0).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = rows < I
    msk = jm[:, None, None] & rm[None, :, None]
    wg = w_ptr + e[:, None, None] * stride_we + rows[None, :, None] * stride_wn
    sg = s_ptr + e[:, None, None] * stride_se + rows[None, :, None] * stride_sn
    wu, su = wg + I * stride_wn, sg + I * stride_sn
    acc_g3 = tl.zeros([KP, BLOCK_N, BLOCK_K // 16], dtype=tl.float32)
    acc_u3 = tl.zeros([KP, BLOCK_N, BLOCK_K // 16], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        bi = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        pb = p_ptr + m * 8 * NB + bi
        X0 = tl.load(pb)[None, None, :]
        X1 = tl.load(pb + NB)[None, None, :]
        X2 = tl.load(pb + 2 * NB)[None, None, :]
        X3 = tl.load(pb + 3 * NB)[None, None, :]
        X4 = tl.load(pb + 4 * NB)[None, None, :]
        X5 = tl.load(pb + 5 * NB)[None, None, :]
        X6 = tl.load(pb + 6 * NB)[None, None, :]
        X7 = tl.load(pb + 7 * NB)[None, None, :]
        inv = tl.load(inv_ptr + m * NB + bi)[None, None, :]
        acc_g3 += md.tile_dot_half2(wg, sg, msk, X0, X1, X2, X3, X4, X5, X6, X7, inv, k0, KP, BLOCK_N, BLOCK_K, ASM)
        acc_u3 += md.tile_dot_half2(wu, su, msk, X0, X1, X2, X3, X4, X5, X6, X7, inv, k0, KP, BLOCK_N, BLOCK_K, ASM)
    acc_g, acc_u = tl.sum(acc_g3, axis=2), tl.sum(acc_u3, axis=2)
    g = acc_g * (tl.load(g_ptr + e * 2, mask=jm, other=0.0) * 16384.0)[:, None]
    u = acc_u * (tl.load(g_ptr + e * 2 + 1, mask=jm, other=0.0) * 16384.0)[:, None]
    pairs = m * topk + j
    tl.store(h_ptr + pairs[:, None] * stride_hm + rows[None, :], g / (1.0 + tl.exp(-g)) * u, mask=jm[:, None] & rm[None, :])

def main(deadline_s:float=150.0)->int:
    t0 = time.perf_counter()
    dev, asm = "cuda", True
    E, K, I, H, k = (REAL[x] for x in ("E", "K", "I", "H", "topk"))
    NB, KP, cdiv = K // 16, triton.next_power_of_2(k), lambda a, b: -(-a // b)
    w13, w2 = random_experts(E, K, I, H, dev)
    c64 = md.codes_for(w13, "w13", "half2")
    out = {"shapes": REAL, "gpu": torch.cuda.get_device_name(0), "checks": [], "timings": []}
    path = [Path(__file__).resolve().parent / "results" / "pairs.json"] + ([Path(os.environ["OUT"]) / "pairs.json"] if os.environ.get("OUT") else [])
    def save():
        for p in path: p.parent.mkdir(parents=True, exist_ok=True); p.write_text(json.dumps(out, indent=1))
    def prologue(x, P, V, block_b=64):
        act_pairs_kernel[(x.shape[0], cdiv(NB, block_b))](x, P, V, NB, x.stride(0), BLOCK_B=block_b, ASM=asm, num_warps=2)
    def proto(P, V, ids, h, t):
        gate_up_pairs_kernel[(cdiv(I, t[0]), ids.shape[0])](P, V, ids, c64, w13.scale, w13.global_scale, h, K, I, k,
            c64.stride(0), c64.stride(1), w13.scale.stride(0), w13.scale.stride(1), h.stride(0),
            KP=KP, BLOCK_N=t[0], BLOCK_K=t[1], NUM_STAGES=t[3], ASM=asm, num_warps=t[2])
    def ref_gate_up(x, ids, h, t:md.Tile):
        c = md.codes_for(w13, "w13", t.read)
        md.moe_gate_up_kernel[(cdiv(I, t.block_n), x.shape[0])](x, ids, c, w13.scale, w13.global_scale, h, K, I, k,
            x.stride(0), c.stride(0), c.stride(1), w13.scale.stride(0), w13.scale.stride(1), h.stride(0),
            KP=KP, BLOCK_N=t.block_n, BLOCK_K=md.block_k_for(K, t.block_k), NUM_STAGES=t.num_stages, WORDS=t.words,
            HALF2=t.half2, ASM=asm, num_warps=t.num_warps)
    for M in (1, 4):                                                          # checks at the real shapes
        x = torch.randn(M, K, device=dev).to(torch.bfloat16)
        ids = routing(M, E, k, dev)[0].to(torch.int32).contiguous()
        P, V = torch.empty(M, 8, NB, dtype=torch.int32, device=dev), torch.empty(M, NB, device=dev)
        h1, h2, h3 = (torch.empty(M * k, I, device=dev) for _ in range(3))
        prologue(x, P, V); proto(P, V, ids, h1, (1, 1024, 4, 2))
        ref_gate_up(x, ids, h2, md.Tile(1, 1024, num_stages=2, half2=True))
        ref_gate_up(x, ids, h3, md.Tile(1, 1024, num_stages=2, words=True))
        out["checks"].append({"tokens": M, "proto_vs_half2": relative_rms(h1, h2), "proto_vs_words": relative_rms(h1, h3),
                              "half2_vs_words": relative_rms(h2, h3)})
    for M in (1, 2, 4, 8):                                                    # the package's path (08f PAIRS, PAIR_TILES)
        x = torch.randn(M, K, device=dev).to(torch.bfloat16)
        ids, wts = routing(M, E, k, dev)
        pr = md.act_pairs_triton(x)
        a = md.moe_decode_triton(x, ids, wts, w13, w2, pairs=pr)
        b = md.moe_decode_triton(x, ids, wts, w13, w2, gate_up=md.tiles_for(M, pairs=True)[0])
        out["checks"].append({"tokens": M, "package_pairs_vs_half2": relative_rms(a, b), "equal": bool(torch.equal(a, b))})
        xs = [torch.randn(M, K, device=dev).to(torch.bfloat16) for _ in range(8)]
        rs = [routing(M, E, k, dev, seed=7 + r) for r in range(8)]
        prs = [md.act_pairs_triton(x) for x in xs]
        for name, fn in (("package TILES", lambda x, r, p: md.moe_decode_triton(x, *r, w13, w2)),
                         ("package PAIR_TILES + pairs", lambda x, r, p: md.moe_decode_triton(x, *r, w13, w2, pairs=p))):
            us = time_graph([lambda x=x, r=r, p=p: fn(x, r, p) for x, r, p in zip(xs, rs, prs)], 50)
            out["timings"].append({"tokens": M, "kernel": name, "both_kernels": True, "us": round(us, 2)}); print(json.dumps(out["timings"][-1]))
    print(json.dumps(out["checks"])); save()
    rot = 8
    for M in (1, 2, 4, 8):
        xs = [torch.randn(M, K, device=dev).to(torch.bfloat16) for _ in range(rot)]
        ids = [routing(M, E, k, dev, seed=100 * M + r)[0].to(torch.int32).contiguous() for r in range(rot)]
        hs = [torch.empty(M * k, I, device=dev) for _ in range(rot)]
        Ps = [torch.empty(M, 8, NB, dtype=torch.int32, device=dev) for _ in range(rot)]
        Vs = [torch.empty(M, NB, device=dev) for _ in range(rot)]
        for x, P, V in zip(xs, Ps, Vs): prologue(x, P, V)
        def row(kind, tile, us):
            r = {"tokens": M, "kernel": kind, "tile": tile, "us": round(us, 2)}
            out["timings"].append(r); print(json.dumps(r), flush=True); save()
        g08f = md.tiles_for(M)[0]
        for name, t in (("08f words", md.Tile(1, 1024, num_stages=2, words=True)), ("08f TILES", g08f)):
            row(name, [t.block_n, t.block_k, t.num_warps, t.num_stages, t.read], time_graph([lambda x=x, i=i, h=h, t=t: ref_gate_up(x, i, h, t) for x, i, h in zip(xs, ids, hs)], 50))
        row("prologue", None, time_graph([lambda x=x, P=P, V=V: prologue(x, P, V) for x, P, V in zip(xs, Ps, Vs)], 50))
        for t in ((1, 1024, 4, 2), (1, 1024, 2, 2), (1, 2048, 4, 2), (1, 512, 2, 2), (2, 1024, 4, 2), (1, 4096, 8, 1), (1, 1024, 8, 2)):
            if time.perf_counter() - t0 > deadline_s: out.setdefault("skipped", []).append([M, list(t)]); continue
            row("proto", list(t), time_graph([lambda P=P, V=V, i=i, h=h, t=t: proto(P, V, i, h, t) for P, V, i, h in zip(Ps, Vs, ids, hs)], 50))
            row("prologue+proto", list(t), time_graph([lambda x=x, P=P, V=V, i=i, h=h, t=t: (prologue(x, P, V), proto(P, V, i, h, t))
                                                       for x, P, V, i, h in zip(xs, Ps, Vs, ids, hs)], 50))
    out["elapsed_s"] = round(time.perf_counter() - t0, 1); save()
    return 0

if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 150.0))
