#!/usr/bin/env python
"""A KDA decode step in three launches (chapter 08j's gates mode, 08i's pair GEMV) against today's six, on one GPU.

    python -m benchmarks.kernels.kda_inproj [--tokens 1,2,4,8] [--pair-tiles 32x256x4x3,...] [--fg-tiles same,fma:1x4096,...]
                                         [--warps 4,8] [--block-r 32,64,128] [--out DIR]

Needs vLLM (the plugin's modules register their ops with it), so this runs on the GPU machine after the staging
steps. Real per-rank shapes at TP2: `qkvb_proj` [12,320, 4,096], `fg_a_proj` [256, 4,096], `f_b_proj` and `g_b_proj`
[4,096, 128], 32 KDA heads of 128, conv width 4, bf16.

What a KDA layer launches between its input norm and `o_proj`, per decode step:
* today (`six`): 08i's `qkvb_proj` GEMV (its `GEMV_TILES` plan), 08h's two gate kernels, beta (`kda_beta`, compiled
  into one kernel as the engine's inductor does), 08j's kernel;
* the gates mode (`three` is two of them here: `o_proj` is the same in both): 08i's `gemv_pair` over `qkvb_proj`
  and `fg_a_proj`, then 08j's kernel in its gates mode (`GATES`).

Checks first, on the GPU: 08j's `lr_check` cases in fp32; at the real shapes in bf16, the gates mode's output and
states against today's chain and against `kda_decode_lr_torch` (the module path in the activation dtype); the pair
GEMV's `qkvb` output bit-equal to the single GEMV at the same tile, its `fg` output against `F.linear`.

Timing: each chain captured in one CUDA graph over `--rotations` copies of every weight and state slot (more than
the 50 MB L2 between two uses of one copy, as in the engine, where each layer reads its own weights), replayed.
Reported per token count: microseconds per step of one layer for today's chain and its parts; the pair GEMV per
(qkvb tile, fg tile) and the gates-mode kernel per (warps, block_r), each alone; the gates mode's chain with the
plan's pair (`three (plan)`) and with the fastest parts (`three`); the better chain and the ratio.

Output: `benchmarks/results/incoming/kda_inproj_h200.json` (and `$OUT/` when set), written after every row.
"""
from __future__ import annotations
import argparse, json, sys, time
from pathlib import Path

from benchmarks.common import ROOT, add_run_args, int_list, json_writer, kind_tiles1, result_head, result_paths, tile_list, time_graph
from solar_open2.config import SolarOpen2Config

TP = 2
QKVB_TILES = ((32, 256, 4, 3), (64, 256, 4, 3))   # the pair GEMV's qkvb_proj rows (tensor cores)
FG_TILES = (None, ("fma", (1, 4096)), ("fma", (2, 4096)), ("fma", (4, 2048, 2)))   # fg_a_proj's programs; None: W0's tile

def _name(tile, fg)->str:
    return "x".join(map(str, tile)) + (" + W1 " + fg[0] + " " + "x".join(map(str, fg[1])) if fg else "")

def rank_shapes(cfg:SolarOpen2Config, tp:int=TP)->dict:
    "One KDA layer on one rank: heads, head size, conv width, the gates' rank, the hidden size."
    return dict(Hl=cfg.kda_num_heads // tp, D=cfg.kda_head_dim, W=cfg.kda_conv_size, R=cfg.kda_head_dim,
                hidden=cfg.hidden_size)

REAL = rank_shapes(SolarOpen2Config.real())

def make_layer(T:int, slots:int, s:dict, dtype, device, seed:int=0)->dict:
    "One layer's weights and states at shapes `s`, and a [T, hidden] input: what both chains read."
    import torch
    from solar_open2.vllm.ops.kda_decode import random_case
    g = torch.Generator().manual_seed(seed)
    r = lambda *sh: torch.randn(*sh, generator=g)
    Hl, D, R, H = s["Hl"], s["D"], s["R"], s["hidden"]
    c = random_case(T, T, Hl, D, s["W"], slots, dtype, seed, null_row=False)
    for k in ("qkv", "g1", "beta", "g2", "idx"): c.pop(k)
    w = dict(x=r(T, H).to(dtype), wqkvb=(r(3 * Hl * D + Hl, H) / H ** 0.5).to(dtype), wa=(r(2 * R, H) / H ** 0.5).to(dtype),
             wfb=(r(Hl * D, R) / R ** 0.5).to(dtype), wgb=(r(Hl * D, R) / R ** 0.5).to(dtype))
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in {**c, **w}.items()}

def six_step(L:dict, idx, out, beta_fn, gemv_mod, gates_mod, kd)->None:
    "Today's chain: qkvb GEMV, 08h's gate kernels, beta, 08j's kernel (writes `out`)."
    Hl, D = L["rec_state"].shape[1], L["rec_state"].shape[2]
    qkvb = gemv_mod.gemv(L["x"], L["wqkvb"])                                  # [T, 3·Hl·D + Hl]
    qkv, b = qkvb.split([3 * Hl * D, Hl], -1)
    g1, g2 = gates_mod.kda_gates_triton(L["x"], L["wa"], L["wfb"], L["wgb"])
    kd.kda_decode_triton(qkv, L["conv_state"], L["conv_w"], g1, L["A_log"], L["dt_bias"], beta_fn(b), g2, L["norm_w"],
                         L["eps"], L["rec_state"], idx, out=out)

def three_step(L:dict, idx, out, gemv_mod, kd, pair=None, num_warps:int|None=None, block_r:int|None=None)->None:
    """The gates mode: the pair GEMV (`pair` = (tile, W1's kind, W1's tile), or the plan), then 08j's kernel with the
    gates and beta (writes `out`); warps and rank step 08j's defaults unless given."""
    Hl, D = L["rec_state"].shape[1], L["rec_state"].shape[2]
    if pair is None: qkvb, fg = gemv_mod.gemv_pair(L["x"], L["wqkvb"], L["wa"])
    else: qkvb, fg = gemv_mod.gemv_pair_triton(L["x"], L["wqkvb"], L["wa"], "mma", *pair)
    qkv, b = qkvb.split([3 * Hl * D, Hl], -1)
    kd.kda_decode_lr_triton(qkv, b, fg, L["wfb"], L["wgb"], L["conv_state"], L["conv_w"], L["A_log"], L["dt_bias"],
                            L["norm_w"], L["eps"], L["rec_state"], idx, out=out, num_warps=num_warps or kd.NUM_WARPS,
                            block_r=block_r or kd.LR_BLOCK_R)

def bf16_check(s:dict, device, beta_fn, gemv_mod, gates_mod, kd, T:int=4)->dict:
    "The gates mode against today's chain and the module path, at shapes `s` in bf16 (output and states); the pair GEMV's outputs."
    import torch
    import torch.nn.functional as F
    from solar_open2.nvfp4 import relative_rms
    L = make_layer(T, T + 2, s, torch.bfloat16, device, seed=3)
    idx = torch.arange(1, T + 1, dtype=torch.int32, device=device)
    clone = lambda: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in L.items()}
    a, b_, ref = clone(), clone(), clone()
    o6, o3 = (torch.empty(T, s["Hl"], s["D"], dtype=torch.bfloat16, device=device) for _ in range(2))
    six_step(a, idx, o6, beta_fn, gemv_mod, gates_mod, kd)
    three_step(b_, idx, o3, gemv_mod, kd)
    Hl, D, R = s["Hl"], s["D"], s["R"]
    qkvb = F.linear(ref["x"], ref["wqkvb"])
    y_ref = kd.kda_decode_lr_torch(qkvb[:, :3 * Hl * D], qkvb[:, 3 * Hl * D:], F.linear(ref["x"], ref["wa"]), ref["wfb"],
                                   ref["wgb"], ref["conv_state"], ref["conv_w"], ref["A_log"], ref["dt_bias"], ref["norm_w"],
                                   ref["eps"], ref["rec_state"], idx)
    live = idx.long()
    cmp = lambda o, d: {"out": relative_rms(o.float().cpu(), y_ref.float().cpu()),
                        "rec_state": relative_rms(d["rec_state"][live].cpu(), ref["rec_state"][live].cpu()),
                        "conv_state": relative_rms(d["conv_state"][live].float().cpu(), ref["conv_state"][live].float().cpu())}
    r = {"case": [T, Hl, D, s["W"], R], "dtype": "bfloat16", "six": cmp(o6, a), "three": cmp(o3, b_),
         "three_vs_six_out": relative_rms(o3.float().cpu(), o6.float().cpu())}
    q1, f1 = gemv_mod.gemv_pair(L["x"], L["wqkvb"], L["wa"])
    r["pair_qkvb_equal_single"] = bool(torch.equal(q1, gemv_mod.gemv(L["x"], L["wqkvb"])))
    r["pair_fg_vs_linear"] = relative_rms(f1.float().cpu(), F.linear(L["x"], L["wa"]).float().cpu())
    r["pair_fg_linear_vs_fp32"] = relative_rms(F.linear(L["x"], L["wa"]).float().cpu(), (L["x"].float() @ L["wa"].float().T).cpu())
    r["pass"] = all(r["three"][k] <= 1.5 * r["six"][k] + 1e-3 for k in ("out", "rec_state", "conv_state")) \
        and r["pair_qkvb_equal_single"] and r["pair_fg_vs_linear"] < 1e-2
    return r

GATE_RULE = "fp32 cases within 1e-5 of the plain path; bf16 at most 1.5x the plain path's distance"

def gate(res:dict)->bool:
    "The sanity gate: the fp32 cases match the plain path and the bf16 check passes."
    fp32 = [c for c in res["checks"] if c["kind"] == "fp32 cases"]
    bf16 = [c for c in res["checks"] if c["kind"].startswith("bf16")]
    return bool(fp32 and bf16) and all(max(c["out"], c["rec_state"], c["conv_state"]) < 1e-5 for c in fp32) \
        and all(c["pass"] for c in bf16)

def run(tokens=(1, 2, 4, 8), pair_tiles=QKVB_TILES, fg_tiles=FG_TILES, warps=(4, 8), block_r=(32, 64, 128), rotations:int=4, reps:int=50,
        deadline_s:float=150.0, out_paths=(), device:str="cuda", shapes:dict|None=None, timer=None, beta_fn=None)->dict:
    """Checks, then per token count, each in one CUDA graph over `rotations` copies: today's chain and its parts; the
    pair GEMV per (W0 tile, W1 tile) and the gates-mode kernel per (warps, block_r); the gates mode's chain with the
    plan's pair and 08j's defaults, and with the fastest pair and kernel. `device`, `shapes`, `timer` and `beta_fn` exist
    for the CPU test."""
    import torch
    from solar_open2.vllm.ops import gemv as gemv_mod, kda_decode as kd, kda_gates as gates_mod
    from solar_open2.kda import kda_beta
    t0 = time.perf_counter()
    s, timer = dict(shapes or REAL), timer or time_graph
    beta_fn = beta_fn or torch.compile(kda_beta, dynamic=False)             # one kernel, as the engine's inductor makes it
    res = {**result_head("kda_inproj_h200", device, ROOT), "shapes": s, "rotations": rotations, "checks": [],
           "timings": [], "skipped": []}
    try:
        import vllm
        res["versions"]["vllm"] = vllm.__version__
    except ImportError: pass
    save = json_writer(res, out_paths, gate, GATE_RULE)
    res["checks"] = [{**c, "kind": "fp32 cases"} for c in kd.lr_check(device=device)]
    res["checks"].append({**bf16_check(s, device, beta_fn, gemv_mod, gates_mod, kd), "kind": "bf16, real shapes"})
    save()
    late = lambda: time.perf_counter() - t0 > deadline_s
    Hl, D = s["Hl"], s["D"]
    for T in tokens:
        Ls = [make_layer(T, 1 + T, s, torch.bfloat16, device, seed=100 * T + i) for i in range(rotations)]
        idx = torch.arange(1, T + 1, dtype=torch.int32, device=device)
        out = torch.empty(T, Hl, D, dtype=torch.bfloat16, device=device)
        pre = {}                                                              # today's kernel inputs per copy, for its parts' timings
        for L in Ls:
            qkv, b = gemv_mod.gemv(L["x"], L["wqkvb"]).split([3 * Hl * D, Hl], -1)   # [T, 3·Hl·D], [T, Hl]
            g1, g2 = gates_mod.kda_gates_triton(L["x"], L["wa"], L["wfb"], L["wgb"])
            pre[id(L)] = dict(qkv=qkv, b=b, g1=g1, g2=g2, beta=beta_fn(b))
        kernel_only = lambda L, p: kd.kda_decode_triton(p["qkv"], L["conv_state"], L["conv_w"], p["g1"], L["A_log"], L["dt_bias"],
                                                        p["beta"], p["g2"], L["norm_w"], L["eps"], L["rec_state"], idx, out=out)
        variants = [("six", None, lambda L: six_step(L, idx, out, beta_fn, gemv_mod, gates_mod, kd)),
                    ("six: qkvb GEMV", None, lambda L: gemv_mod.gemv(L["x"], L["wqkvb"])),
                    ("six: gate kernels", None, lambda L: gates_mod.kda_gates_triton(L["x"], L["wa"], L["wfb"], L["wgb"])),
                    ("six: beta", None, lambda L: beta_fn(pre[id(L)]["b"])),
                    ("six: kernel", None, lambda L: kernel_only(L, pre[id(L)]))]
        pre3 = {}                                                             # the gates mode's kernel inputs per copy
        for L in Ls:
            qkvb, fg = gemv_mod.gemv_pair(L["x"], L["wqkvb"], L["wa"])
            qkv, b = qkvb.split([3 * Hl * D, Hl], -1)
            pre3[id(L)] = dict(qkv=qkv, b=b, fg=fg)
        lr_only = lambda L, p, w, br: kd.kda_decode_lr_triton(p["qkv"], p["b"], p["fg"], L["wfb"], L["wgb"], L["conv_state"],
            L["conv_w"], L["A_log"], L["dt_bias"], L["norm_w"], L["eps"], L["rec_state"], idx, out=out, num_warps=w, block_r=br)
        for tile in pair_tiles:
            for fgt in fg_tiles:
                pair = (tile,) + (fgt or (None, None))
                variants.append((f"three: pair GEMV {_name(tile, fgt)}", {"tile": list(tile), "fg_tile": fgt and [fgt[0], list(fgt[1])]},
                                 lambda L, pair=pair: gemv_mod.gemv_pair_triton(L["x"], L["wqkvb"], L["wa"], "mma", *pair)))
        for w in warps:
            for br in block_r:
                variants.append(("three: kernel", {"num_warps": w, "block_r": br}, lambda L, w=w, br=br: lr_only(L, pre3[id(L)], w, br)))
        rows = []
        def time_rows(vs):
            for name, cfg, f in vs:
                if late(): res["skipped"].append({"tokens": T, "path": name, **(cfg or {})}); continue
                try: us = timer([lambda L=L: f(L) for L in Ls], reps)
                except Exception as e:                                       # record, keep going
                    res["timings"].append({"tokens": T, "path": name, **(cfg or {}), "error": f"{type(e).__name__}: {e}"[:400]})
                    continue
                r = {"tokens": T, "path": name, **(cfg or {}), "us": round(us, 2)}
                rows.append(r); res["timings"].append(r); print(json.dumps(r), flush=True); save()
        time_rows(variants)
        pairs = [r for r in rows if r["path"].startswith("three: pair GEMV")]
        kernels = [r for r in rows if r["path"] == "three: kernel"]
        chains = [("three (plan)", {"pair": "plan", "num_warps": kd.NUM_WARPS, "block_r": kd.LR_BLOCK_R},   # the package's defaults
                   lambda L: three_step(L, idx, out, gemv_mod, kd))]
        if pairs and kernels:                                                 # the fastest parts, together in one chain
            bp, bk = min(pairs, key=lambda r: r["us"]), min(kernels, key=lambda r: r["us"])
            pair = (tuple(bp["tile"]),) + ((bp["fg_tile"][0], tuple(bp["fg_tile"][1])) if bp["fg_tile"] else (None, None))
            chains.append(("three", {"pair": bp["path"].removeprefix("three: pair GEMV "), "num_warps": bk["num_warps"],
                                     "block_r": bk["block_r"]},
                           lambda L: three_step(L, idx, out, gemv_mod, kd, pair, bk["num_warps"], bk["block_r"])))
        time_rows(chains)
        six = [r for r in rows if r["path"] == "six"]
        three = [r for r in rows if r["path"] in ("three", "three (plan)")]
        if six and three:
            best = min(three, key=lambda r: r["us"])
            res.setdefault("best", {})[str(T)] = {"six_us": six[0]["us"], "three_us": best["us"], "path": best["path"],
                                                  "pair": best["pair"], "num_warps": best["num_warps"], "block_r": best["block_r"],
                                                  "six_over_three": round(six[0]["us"] / best["us"], 2),
                                                  "saved_us": round(six[0]["us"] - best["us"], 2)}
        save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=(1, 2, 4, 8))
    ap.add_argument("--pair-tiles", type=tile_list, default=QKVB_TILES, help="tensor-core tiles for the pair GEMV's qkvb_proj rows")
    ap.add_argument("--fg-tiles", type=kind_tiles1, default=FG_TILES, help="tiles for its fg_a_proj rows: same,fma:1x4096,...")
    ap.add_argument("--warps", type=int_list, default=(4, 8), help="num_warps values for the gates-mode kernel")
    ap.add_argument("--block-r", type=int_list, default=(32, 64, 128), help="rank step widths for the gates-mode kernel")
    ap.add_argument("--rotations", type=int, default=4, help="copies of every weight and state (4 x 104 MB at the real shapes)")
    add_run_args(ap, reps=50, deadline_s=150.0)
    a = ap.parse_args(argv)
    outs = result_paths("kda_inproj_h200", a.results_dir, a.out)
    if outs is None: return 2
    res = run(a.tokens, a.pair_tiles, a.fg_tiles, a.warps, a.block_r, a.rotations, a.reps, a.deadline_s, outs)
    for c in res["checks"]: print("check", json.dumps(c))
    for T, b in res.get("best", {}).items():
        print(f"{T} token(s): six launches {b['six_us']} us, three {b['three_us']} us ({b['path']}: pair {b['pair']}, "
              f"{b['num_warps']} warps, block_r {b['block_r']}), x{b['six_over_three']}")
    return 0 if gate(res) else 1

if __name__ == "__main__":
    sys.exit(main())
