"""Prototype v2 batch-1 NVFP4 MoE kernels: all top-k experts of a token in one program, E2M1 via fp16 bit patterns."""
import os, torch, triton, triton.language as tl

@triton.jit
def nib_pair(byt):
    "Bytes (int32) -> (low, high) nibble values · 2^-14 (fp32): the 3 magnitude bits land on fp16's exponent/mantissa seam."
    lo = ((byt & 8) << 12) | ((byt & 7) << 9)
    hi = ((byt & 128) << 8) | ((byt & 112) << 5)
    return (lo.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32),
            hi.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32))

@triton.jit
def e4m3(b):
    ex = (b >> 3) & 15
    mt = (b & 7).to(tl.float32)
    v = tl.where(ex > 0, tl.exp2((ex - 7).to(tl.float32)) * (1.0 + mt * 0.125), mt * 0.001953125)
    return tl.where((b & 128) != 0, -v, v)

@triton.jit
def tile_dot(wp, sp, msk, xe, xo, k0, KP:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr):
    "wp/sp: [KP, BN, 1] row pointers; xe/xo: [KP or 1, 1, BK/2] even/odd inputs -> [KP, BN] block-scaled sums (·2^-14)."
    bb = tl.arange(0, BLOCK_K // 2)
    byt = tl.load(wp + (k0 // 2 + bb)[None, None, :], mask=msk, other=0).to(tl.int32)   # [KP, BN, BK/2]
    lo, hi = nib_pair(byt)
    p = lo * xe + hi * xo                                                                 # [KP, BN, BK/2]
    p = tl.sum(tl.reshape(p, (KP, BLOCK_N, BLOCK_K // 16, 8)), axis=3)                   # [KP, BN, BK/16]
    sb = tl.arange(0, BLOCK_K // 16)
    sc = e4m3(tl.load(sp + (k0 // 16 + sb)[None, None, :], mask=msk, other=0).to(tl.int32))
    return tl.sum(p * sc, axis=2)                                                         # [KP, BN]

@triton.jit
def gate_up_kernel2(x_ptr, ids_ptr, w_ptr, s_ptr, g_ptr, h_ptr, K, I, topk,
                    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_hm,
                    KP:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, NUM_STAGES:tl.constexpr):
    pid_n, m = tl.program_id(0), tl.program_id(1)
    j = tl.arange(0, KP); jm = j < topk
    e = tl.load(ids_ptr + m * topk + j, mask=jm, other=0).to(tl.int64)                   # [KP]
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N); rm = rows < I
    msk = jm[:, None, None] & rm[None, :, None]
    wg = w_ptr + e[:, None, None] * stride_we + rows[None, :, None] * stride_wn          # [KP, BN, 1]
    sg = s_ptr + e[:, None, None] * stride_se + rows[None, :, None] * stride_sn
    wu, su = wg + I * stride_wn, sg + I * stride_sn
    acc_g = tl.zeros([KP, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([KP, BLOCK_N], dtype=tl.float32)
    hb = tl.arange(0, BLOCK_K // 2)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        xe = tl.load(x_ptr + m * stride_xm + k0 + 2 * hb).to(tl.float32)[None, None, :]
        xo = tl.load(x_ptr + m * stride_xm + k0 + 2 * hb + 1).to(tl.float32)[None, None, :]
        acc_g += tile_dot(wg, sg, msk, xe, xo, k0, KP, BLOCK_N, BLOCK_K)
        acc_u += tile_dot(wu, su, msk, xe, xo, k0, KP, BLOCK_N, BLOCK_K)
    g = acc_g * (tl.load(g_ptr + e * 2, mask=jm, other=0.0) * 16384.0)[:, None]
    u = acc_u * (tl.load(g_ptr + e * 2 + 1, mask=jm, other=0.0) * 16384.0)[:, None]
    pairs = m * topk + j
    tl.store(h_ptr + pairs[:, None] * stride_hm + rows[None, :], g / (1.0 + tl.exp(-g)) * u, mask=jm[:, None] & rm[None, :])

@triton.jit
def down_kernel2(h_ptr, ids_ptr, wts_ptr, w_ptr, s_ptr, g_ptr, o_ptr, I, H, topk,
                 stride_hm, stride_we, stride_wn, stride_se, stride_sn, stride_om,
                 KP:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, NUM_STAGES:tl.constexpr):
    pid_n, m = tl.program_id(0), tl.program_id(1)
    j = tl.arange(0, KP); jm = j < topk
    pairs = m * topk + j
    e = tl.load(ids_ptr + pairs, mask=jm, other=0).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N); rm = rows < H
    msk = jm[:, None, None] & rm[None, :, None]
    wp = w_ptr + e[:, None, None] * stride_we + rows[None, :, None] * stride_wn
    sp = s_ptr + e[:, None, None] * stride_se + rows[None, :, None] * stride_sn
    acc = tl.zeros([KP, BLOCK_N], dtype=tl.float32)
    hb = tl.arange(0, BLOCK_K // 2)
    for k0 in tl.range(0, I, BLOCK_K, num_stages=NUM_STAGES):
        he = tl.load(h_ptr + pairs[:, None] * stride_hm + (k0 + 2 * hb)[None, :], mask=jm[:, None], other=0.0)[:, None, :]
        ho = tl.load(h_ptr + pairs[:, None] * stride_hm + (k0 + 2 * hb + 1)[None, :], mask=jm[:, None], other=0.0)[:, None, :]
        acc += tile_dot(wp, sp, msk, he, ho, k0, KP, BLOCK_N, BLOCK_K)
    wt = tl.load(wts_ptr + pairs, mask=jm, other=0.0).to(tl.float32) * tl.load(g_ptr + e, mask=jm, other=0.0) * 16384.0
    out = tl.sum(acc * wt[:, None], axis=0)
    tl.store(o_ptr + m * stride_om + rows, out, mask=rm)

def bk_for(K, want):
    b = want
    while K % b: b //= 2
    return b

def moe2(x, topk_ids, topk_weights, w13, w2, bn=(8, 8), bk=(256, 128), warps=(4, 4), stages=(1, 1)):
    M, K = x.shape; k = topk_ids.shape[1]
    I = w13.packed.shape[1] // 2; H = w2.packed.shape[1]
    KP = triton.next_power_of_2(k)
    ids = topk_ids.to(torch.int32).contiguous(); wts = topk_weights.float().contiguous()
    h = torch.empty(M * k, I, dtype=torch.float32, device=x.device)
    out = torch.empty(M, H, dtype=torch.float32, device=x.device)
    s13, s2 = w13.scale.view(torch.uint8), w2.scale.view(torch.uint8)
    cd = lambda a, b: -(-a // b)
    gate_up_kernel2[(cd(I, bn[0]), M)](x, ids, w13.packed, s13, w13.global_scale, h, K, I, k,
        x.stride(0), w13.packed.stride(0), w13.packed.stride(1), s13.stride(0), s13.stride(1), h.stride(0),
        KP=KP, BLOCK_N=bn[0], BLOCK_K=bk_for(K, bk[0]), NUM_STAGES=stages[0], num_warps=warps[0])
    down_kernel2[(cd(H, bn[1]), M)](h, ids, wts, w2.packed, s2, w2.global_scale, out, I, H, k,
        h.stride(0), w2.packed.stride(0), w2.packed.stride(1), s2.stride(0), s2.stride(1), out.stride(0),
        KP=KP, BLOCK_N=bn[1], BLOCK_K=bk_for(I, bk[1]), NUM_STAGES=stages[1], num_warps=warps[1])
    return out

@triton.jit
def gate_up_kernel3(x_ptr, ids_ptr, w_ptr, s_ptr, hp_ptr, K, I, topk, KSPLIT,
                    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_hm,
                    KP:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, NUM_STAGES:tl.constexpr):
    "Split-K: pre-activation gate|up partial sums (block-scaled, ·2^-14, no global scale) atomically added to hp [M·k, 2I]."
    pid_n, m, sk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    j = tl.arange(0, KP); jm = j < topk
    e = tl.load(ids_ptr + m * topk + j, mask=jm, other=0).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N); rm = rows < I
    msk = jm[:, None, None] & rm[None, :, None]
    wg = w_ptr + e[:, None, None] * stride_we + rows[None, :, None] * stride_wn
    sg = s_ptr + e[:, None, None] * stride_se + rows[None, :, None] * stride_sn
    wu, su = wg + I * stride_wn, sg + I * stride_sn
    acc_g = tl.zeros([KP, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([KP, BLOCK_N], dtype=tl.float32)
    hb = tl.arange(0, BLOCK_K // 2)
    for k0 in tl.range(sk * KSPLIT, tl.minimum(sk * KSPLIT + KSPLIT, K), BLOCK_K, num_stages=NUM_STAGES):
        xe = tl.load(x_ptr + m * stride_xm + k0 + 2 * hb).to(tl.float32)[None, None, :]
        xo = tl.load(x_ptr + m * stride_xm + k0 + 2 * hb + 1).to(tl.float32)[None, None, :]
        acc_g += tile_dot(wg, sg, msk, xe, xo, k0, KP, BLOCK_N, BLOCK_K)
        acc_u += tile_dot(wu, su, msk, xe, xo, k0, KP, BLOCK_N, BLOCK_K)
    pairs = m * topk + j
    om = jm[:, None] & rm[None, :]
    tl.atomic_add(hp_ptr + pairs[:, None] * stride_hm + rows[None, :], acc_g, mask=om, sem="relaxed")
    tl.atomic_add(hp_ptr + pairs[:, None] * stride_hm + I + rows[None, :], acc_u, mask=om, sem="relaxed")

@triton.jit
def down_kernel3(hp_ptr, ids_ptr, wts_ptr, w_ptr, s_ptr, g13_ptr, g_ptr, o_ptr, I, H, topk,
                 stride_hm, stride_we, stride_wn, stride_se, stride_sn, stride_om,
                 KP:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, NUM_STAGES:tl.constexpr):
    "Down projection reading gate|up pre-activations: silu(g)·u computed on load."
    pid_n, m = tl.program_id(0), tl.program_id(1)
    j = tl.arange(0, KP); jm = j < topk
    pairs = m * topk + j
    e = tl.load(ids_ptr + pairs, mask=jm, other=0).to(tl.int64)
    gsg = (tl.load(g13_ptr + e * 2, mask=jm, other=0.0) * 16384.0)[:, None]
    gsu = (tl.load(g13_ptr + e * 2 + 1, mask=jm, other=0.0) * 16384.0)[:, None]
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N); rm = rows < H
    msk = jm[:, None, None] & rm[None, :, None]
    wp = w_ptr + e[:, None, None] * stride_we + rows[None, :, None] * stride_wn
    sp = s_ptr + e[:, None, None] * stride_se + rows[None, :, None] * stride_sn
    acc = tl.zeros([KP, BLOCK_N], dtype=tl.float32)
    hb = tl.arange(0, BLOCK_K // 2)
    for k0 in tl.range(0, I, BLOCK_K, num_stages=NUM_STAGES):
        base = hp_ptr + pairs[:, None] * stride_hm
        ge = tl.load(base + (k0 + 2 * hb)[None, :], mask=jm[:, None], other=0.0) * gsg
        go = tl.load(base + (k0 + 2 * hb + 1)[None, :], mask=jm[:, None], other=0.0) * gsg
        ue = tl.load(base + I + (k0 + 2 * hb)[None, :], mask=jm[:, None], other=0.0) * gsu
        uo = tl.load(base + I + (k0 + 2 * hb + 1)[None, :], mask=jm[:, None], other=0.0) * gsu
        he = (ge / (1.0 + tl.exp(-ge)) * ue)[:, None, :]
        ho = (go / (1.0 + tl.exp(-go)) * uo)[:, None, :]
        acc += tile_dot(wp, sp, msk, he, ho, k0, KP, BLOCK_N, BLOCK_K)
    wt = tl.load(wts_ptr + pairs, mask=jm, other=0.0).to(tl.float32) * tl.load(g_ptr + e, mask=jm, other=0.0) * 16384.0
    tl.store(o_ptr + m * stride_om + rows, tl.sum(acc * wt[:, None], axis=0), mask=rm)

def moe3(x, topk_ids, topk_weights, w13, w2, g=(2, 512, 4, 3, 4), d=(16, 128, 4, 3)):
    M, K = x.shape; k = topk_ids.shape[1]
    I = w13.packed.shape[1] // 2; H = w2.packed.shape[1]
    KP = triton.next_power_of_2(k)
    ids = topk_ids.to(torch.int32).contiguous(); wts = topk_weights.float().contiguous()
    hp = torch.zeros(M * k, 2 * I, dtype=torch.float32, device=x.device)
    out = torch.empty(M, H, dtype=torch.float32, device=x.device)
    s13, s2 = w13.scale.view(torch.uint8), w2.scale.view(torch.uint8)
    cd = lambda a, b: -(-a // b)
    bn, bk, nw, ns, split = g
    bk = bk_for(K, bk); ks = cd(cd(K, split), bk) * bk
    gate_up_kernel3[(cd(I, bn), M, cd(K, ks))](x, ids, w13.packed, s13, hp, K, I, k, ks,
        x.stride(0), w13.packed.stride(0), w13.packed.stride(1), s13.stride(0), s13.stride(1), hp.stride(0),
        KP=KP, BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=ns, num_warps=nw)
    bn, bk, nw, ns = d
    down_kernel3[(cd(H, bn), M)](hp, ids, wts, w2.packed, s2, w13.global_scale, w2.global_scale, out, I, H, k,
        hp.stride(0), w2.packed.stride(0), w2.packed.stride(1), s2.stride(0), s2.stride(1), out.stride(0),
        KP=KP, BLOCK_N=bn, BLOCK_K=bk_for(I, bk), NUM_STAGES=ns, num_warps=nw)
    return out
