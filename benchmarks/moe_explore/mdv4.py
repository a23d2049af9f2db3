"""Variants of the v2 gate_up kernel for a sweep: scale decode mode and reduction shape."""
import torch, triton, triton.language as tl
from benchmarks.moe_explore.mdv2 import nib_pair, e4m3, bk_for

@triton.jit
def tile_dot4(wp, sp, msk, xe, xo, k0, KP:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, MODE:tl.constexpr):
    bb = tl.arange(0, BLOCK_K // 2)
    byt = tl.load(wp + (k0 // 2 + bb)[None, None, :], mask=msk, other=0).to(tl.int32)
    lo, hi = nib_pair(byt)
    if MODE == 2:      # per-byte scale gather (fp8 native), no reshape
        sc = tl.load(sp + (k0 // 16 + bb // 8)[None, None, :], mask=msk, other=0.0).to(tl.float32)
        return tl.sum((lo * xe + hi * xo) * sc, axis=2)
    else:
        p = lo * xe + hi * xo
        p = tl.sum(tl.reshape(p, (KP, BLOCK_N, BLOCK_K // 16, 8)), axis=3)
        sb = tl.arange(0, BLOCK_K // 16)
        if MODE == 0:
            sc = e4m3(tl.load(sp + (k0 // 16 + sb)[None, None, :], mask=msk, other=0).to(tl.int32))
        else:
            sc = tl.load(sp + (k0 // 16 + sb)[None, None, :], mask=msk, other=0.0).to(tl.float32)
        return tl.sum(p * sc, axis=2)

@triton.jit
def gate_up_kernel4(x_ptr, ids_ptr, w_ptr, s_ptr, g_ptr, h_ptr, K, I, topk,
                    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_hm,
                    KP:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, NUM_STAGES:tl.constexpr, MODE:tl.constexpr):
    pid_n, m = tl.program_id(0), tl.program_id(1)
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
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        xe = tl.load(x_ptr + m * stride_xm + k0 + 2 * hb).to(tl.float32)[None, None, :]
        xo = tl.load(x_ptr + m * stride_xm + k0 + 2 * hb + 1).to(tl.float32)[None, None, :]
        acc_g += tile_dot4(wg, sg, msk, xe, xo, k0, KP, BLOCK_N, BLOCK_K, MODE)
        acc_u += tile_dot4(wu, su, msk, xe, xo, k0, KP, BLOCK_N, BLOCK_K, MODE)
    g = acc_g * (tl.load(g_ptr + e * 2, mask=jm, other=0.0) * 16384.0)[:, None]
    u = acc_u * (tl.load(g_ptr + e * 2 + 1, mask=jm, other=0.0) * 16384.0)[:, None]
    pairs = m * topk + j
    tl.store(h_ptr + pairs[:, None] * stride_hm + rows[None, :], g / (1.0 + tl.exp(-g)) * u, mask=jm[:, None] & rm[None, :])

def gate_up4(x, ids, w13, h, bn, bk, nw, ns, mode):
    M, K = x.shape; k = ids.shape[1]; I = w13.packed.shape[1] // 2
    s = w13.scale.view(torch.uint8) if mode == 0 else w13.scale
    gate_up_kernel4[(-(-I // bn), M)](x, ids, w13.packed, s, w13.global_scale, h, K, I, k,
        x.stride(0), w13.packed.stride(0), w13.packed.stride(1), s.stride(0), s.stride(1), h.stride(0),
        KP=triton.next_power_of_2(k), BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=ns, MODE=mode, num_warps=nw)
