"""Prototype (timing only): chapter 08j's gates-mode kernel with each head's value rows split over NS programs.

    python benchmarks/kda_explore/split_v.py [DEADLINE_S]

At one sequence 08j's kernel runs 32 programs (one per head) of 4 warps on a 132-SM H200, each reading its head's
64 KB fp32 state and 64 KB of gate weights: latency, not bandwidth, sets its time. Here grid (T, Hl, NS): a program
convolves the whole q and k of its head (it needs them: l2norm, S·k), its DV = D/NS channels of v, computes all D
values of the forget gate (the decay is per key channel), its DV rows of the state, of o and of the output gate.
What this prototype does NOT do, so its outputs are not the definition's: the RMSNorm over the head's D outputs uses
only the program's DV (the real kernel needs the other programs' sums of squares), and the q/k conv state is read but
not shifted (the real kernel must shift it once, after every program of the head has read it). Both need a
cross-program step (08k's completion counter); this measures whether the split is worth building first.

Output: benchmarks/kda_explore/results/split_v.json (and $OUT/ when set).
"""
import json, os, sys, time
from pathlib import Path
import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
from kernel_bench import result_head, time_graph          # noqa: E402
import kda_inproj_h200 as ki                               # noqa: E402
from solar_open2.vllm import kda_decode as kd              # noqa: E402

@triton.jit
def _gate_rows(fg_ptr, wb_ptr, t, rows, ok, stride_fg, stride_wb, off, NROWS:tl.constexpr, R:tl.constexpr, BLOCK_R:tl.constexpr):
    acc = tl.zeros([NROWS], dtype=tl.float32)
    for r0 in tl.static_range(0, R, BLOCK_R):
        rr = r0 + tl.arange(0, BLOCK_R)
        a = tl.load(fg_ptr + t * stride_fg + off + rr, mask=ok & (rr < R), other=0.0).to(tl.float32)
        w = tl.load(wb_ptr + rows[:, None] * stride_wb + rr[None, :], mask=(rr < R)[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
    return acc.to(fg_ptr.dtype.element_ty).to(tl.float32)

@triton.jit
def _conv(qkv_ptr, cs_ptr, cw_ptr, t, slot, ch, ok, stride_qkv, stride_cs_slot, stride_cs_dim, stride_cs_tap, W:tl.constexpr):
    x = tl.load(qkv_ptr + t * stride_qkv + ch, mask=ok, other=0.0)
    cs = cs_ptr + slot * stride_cs_slot + ch * stride_cs_dim
    y = tl.load(cw_ptr + ch * W + (W - 1)) * x.to(tl.float32)
    for i in tl.static_range(W - 1):
        y += tl.load(cw_ptr + ch * W + i) * tl.load(cs + i * stride_cs_tap, mask=ok, other=0.0).to(tl.float32)
    y = y / (1.0 + tl.exp(-y))
    return y.to(x.dtype).to(tl.float32)

@triton.jit
def split_kernel(qkv_ptr, cs_ptr, cw_ptr, fg_ptr, alog_ptr, dtb_ptr, b_ptr, nw_ptr, h_ptr, idx_ptr, o_ptr, wfb_ptr, wgb_ptr,
                 n, P, stride_qkv, stride_cs_slot, stride_cs_dim, stride_cs_tap, stride_fg, stride_b,
                 stride_h_slot, stride_h_head, stride_h_v, stride_o, stride_wb, scale, eps,
                 D:tl.constexpr, DV:tl.constexpr, W:tl.constexpr, R:tl.constexpr, BLOCK_R:tl.constexpr):
    t, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(idx_ptr + t, mask=t < n, other=0)
    ok = (t < n) & (slot > 0)
    d = tl.arange(0, D)
    dv = s * DV + tl.arange(0, DV)
    q = _conv(qkv_ptr, cs_ptr, cw_ptr, t, slot, h * D + d, ok, stride_qkv, stride_cs_slot, stride_cs_dim, stride_cs_tap, W)
    k = _conv(qkv_ptr, cs_ptr, cw_ptr, t, slot, P + h * D + d, ok, stride_qkv, stride_cs_slot, stride_cs_dim, stride_cs_tap, W)
    v = _conv(qkv_ptr, cs_ptr, cw_ptr, t, slot, 2 * P + h * D + dv, ok, stride_qkv, stride_cs_slot, stride_cs_dim, stride_cs_tap, W)
    q = q / tl.sqrt(tl.sum(q * q) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
    a = _gate_rows(fg_ptr, wfb_ptr, t, h * D + d, ok, stride_fg, stride_wb, 0, D, R, BLOCK_R) + tl.load(dtb_ptr + h * D + d)
    g = -tl.exp(tl.load(alog_ptr + h)) * tl.where(a <= 20.0, tl.log(1.0 + tl.exp(a)), a)
    beta = tl.load(b_ptr + t * stride_b + h, mask=ok, other=0.0).to(tl.float32)
    beta = 2.0 / (1.0 + tl.exp(-beta))
    hp = h_ptr + slot * stride_h_slot + h * stride_h_head + dv[:, None] * stride_h_v + d[None, :]    # [DV, D]
    S = tl.load(hp, mask=ok, other=0.0) * tl.exp(g)[None, :]
    S = S + (beta * (v - tl.sum(S * k[None, :], axis=1)))[:, None] * k[None, :]
    tl.store(hp, S, mask=ok)
    o = tl.sum(S * q[None, :], axis=1)
    o = o.to(o_ptr.dtype.element_ty).to(tl.float32)
    g2 = _gate_rows(fg_ptr, wgb_ptr, t, h * D + dv, ok, stride_fg, stride_wb, R, DV, R, BLOCK_R)
    y = o * tl.rsqrt(tl.sum(o * o) / DV + eps) * tl.load(nw_ptr + dv).to(tl.float32) / (1.0 + tl.exp(-g2))   # local norm: prototype
    tl.store(o_ptr + t * stride_o + h * D + dv, tl.where(ok, y, 0.0).to(o_ptr.dtype.element_ty))

def split_launch(L, qkv, b, fg, idx, out, ns:int, num_warps:int=4, block_r:int=64):
    T, Hl, D = out.shape
    W = L["conv_state"].shape[-1] + 1
    cw = L["conv_w"].reshape(3 * Hl * D, W)
    cs, hs = L["conv_state"], L["rec_state"]
    R = L["wfb"].shape[1]
    split_kernel[(T, Hl, ns)](qkv, cs, cw, fg, L["A_log"].reshape(-1), L["dt_bias"], b, L["norm_w"], hs, idx, out,
        L["wfb"], L["wgb"], idx.shape[0], Hl * D, qkv.stride(0), cs.stride(0), cs.stride(1), cs.stride(2), fg.stride(0),
        b.stride(0), hs.stride(0), hs.stride(1), hs.stride(2), out.stride(0), L["wfb"].stride(0), D ** -0.5, L["eps"],
        D=D, DV=D // ns, W=W, R=R, BLOCK_R=min(block_r, R), num_warps=num_warps)

def main():
    deadline = float(sys.argv[1]) if len(sys.argv) > 1 else 90.0
    t0 = time.perf_counter()
    s = ki.REAL
    Hl, D = s["Hl"], s["D"]
    res = {**result_head("kda_explore_split_v", "cuda", ROOT), "shapes": s, "timings": []}
    outs = [ROOT / "benchmarks" / "kda_explore" / "results" / "split_v.json"] + ([Path(os.environ["OUT"]) / "split_v.json"] if os.environ.get("OUT") else [])
    def save():
        for p in outs: p.parent.mkdir(parents=True, exist_ok=True); p.write_text(json.dumps(res, indent=1))
    from solar_open2.vllm import gemv as gm
    for T in (1, 2, 4, 8):
        Ls = [ki.make_layer(T, 1 + T, s, torch.bfloat16, "cuda", seed=100 * T + i) for i in range(4)]
        idx = torch.arange(1, T + 1, dtype=torch.int32, device="cuda")
        out = torch.empty(T, Hl, D, dtype=torch.bfloat16, device="cuda")
        pre = {}
        for L in Ls:
            qkvb, fg = gm.gemv_pair(L["x"], L["wqkvb"], L["wa"])
            qkv, b = qkvb.split([3 * Hl * D, Hl], -1)
            pre[id(L)] = (qkv, b, fg)
        variants = [("package", None, 4)] + [("split", ns, w) for ns in (1, 2, 4, 8) for w in (4, 2)]
        for name, ns, w in variants:
            if time.perf_counter() - t0 > deadline: break
            if name == "package":
                f = lambda L: kd.kda_decode_lr_triton(*pre[id(L)], L["wfb"], L["wgb"], L["conv_state"], L["conv_w"], L["A_log"],
                                                      L["dt_bias"], L["norm_w"], L["eps"], L["rec_state"], idx, out=out)
            else:
                f = lambda L, ns=ns, w=w: split_launch(L, *pre[id(L)], idx, out, ns, w)
            try: us = time_graph([lambda L=L: f(L) for L in Ls], 50)
            except Exception as e:
                res["timings"].append({"tokens": T, "path": name, "ns": ns, "num_warps": w, "error": str(e)[:300]}); continue
            r = {"tokens": T, "path": name, "ns": ns, "num_warps": w, "us": round(us, 2)}
            res["timings"].append(r); print(json.dumps(r), flush=True); save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1); save()

if __name__ == "__main__":
    main()
