#!/usr/bin/env python
"""The dense projections of one decode step at their real per-rank shapes, cuBLAS against three alternatives, on one GPU.

    python benchmarks/gemv_h200.py [--tokens 1,8] [--methods cublas,triton,fma,autotune] [--deadline-s 240]

Chapter 09's profile puts 3.47 ms of a 6.9 ms decode step (one stream, 2x H200, TP2) in dense GEMMs that read
8.1 GB per rank: 2.3 TB/s on average. The big `qkvb_proj` reaches 3.6 TB/s, but `o_proj`, `g_proj`, the shared
expert, the low-rank gates and the fp32 router lose to cuBLAS's split-K (a reduce kernel after each GEMV), to launch
count and to low parallelism. This script asks how much of that a different GEMM gets back, before anything is
wired into the plugin:

- `cublas`: `torch.nn.functional.linear`, what vLLM's unquantized linear and inductor's extern mm call;
- `triton`: `gemv_kernel` below, tensor-core dots with the token rows padded to 16, no split-K, pipelined K loop,
  over a few tiles (the fastest is reported);
- `fma`: chapter 08h's small-batch kernel (`kda_gates_kernel`, one problem): fp32 multiply-adds on the CUDA cores,
  the whole reduction inside the program, no split-K, no tensor cores, over `FMA_TILES`;
- `autotune`: `torch.compile(mode="max-autotune-no-cudagraphs")` of the same linear at the static shape, that is
  inductor benchmarking its Triton templates against cuBLAS, which is what `perf_h200.py --compile-sizes 1,2,4,8
  --max-autotune` would give the engine.

Each timing captures calls on different weight copies (enough to exceed 200 MB, so the weights come from HBM as in
the engine, where ~10 GB pass between two reads of one matrix) in one CUDA graph and replays it. Reported per shape:
microseconds and TB/s; per method: the step total, sum over shapes of (uses per step x time), the figure to compare
with the profile's dense-GEMM family. Needs only torch and triton (no vLLM, no staging).

Output: `benchmarks/results/gemv_h200.json` (and `$OUT/` when set), written after every timing.
"""
from __future__ import annotations
import argparse, datetime, json, os, platform, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from kernel_bench import git_commit, int_list, kda_gates_module, tile_list, time_graph      # noqa: E402  (what the kernel benchmarks share)
from solar_open2 import budget                                  # noqa: E402
from solar_open2.config import SolarOpen2Config                 # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TP = 2
L2_BYTES = 200e6           # weight bytes each timing cycles through (H200 L2: 50 MB)
TILES = ((16, 256, 4, 3), (32, 256, 4, 3), (64, 128, 4, 3), (16, 512, 4, 3), (32, 512, 8, 3))   # BLOCK_N, BLOCK_K, warps, stages

def dense_shapes(cfg:SolarOpen2Config, tp:int=TP)->list:
    "Every dense projection of a decode step on one rank: name, out N, in K, weight dtype, uses per step."
    H, L = cfg.hidden_size, cfg.num_hidden_layers
    n_kda = len(cfg.kda_layers); n_gqa = L - n_kda
    P = cfg.kda_num_heads * cfg.kda_head_dim                              # KDA projection width
    q = cfg.num_attention_heads * cfg.head_dim; kv = cfg.num_key_value_heads * cfg.head_dim
    inter = cfg.moe_intermediate_size * cfg.n_shared_experts
    vocab = -(-cfg.vocab_size // budget.VOCAB_PADDING) * budget.VOCAB_PADDING
    return [
        dict(name="kda.qkvb_proj", N=(3 * P + cfg.kda_num_heads) // tp, K=H, dtype="bfloat16", per_step=n_kda),
        dict(name="kda.fg_a_proj", N=2 * cfg.kda_gate_rank, K=H, dtype="bfloat16", per_step=n_kda),        # replicated
        dict(name="kda.f_b_proj/g_b_proj", N=P // tp, K=cfg.kda_gate_rank, dtype="bfloat16", per_step=2 * n_kda),
        dict(name="kda.o_proj", N=H, K=P // tp, dtype="bfloat16", per_step=n_kda),
        dict(name="gqa.qkv_proj", N=(q + 2 * kv) // tp, K=H, dtype="bfloat16", per_step=n_gqa),
        dict(name="gqa.g_proj", N=q // tp, K=H, dtype="bfloat16", per_step=n_gqa),
        dict(name="gqa.o_proj", N=H, K=q // tp, dtype="bfloat16", per_step=n_gqa),
        dict(name="shared.gate_up_proj", N=2 * inter // tp, K=H, dtype="bfloat16", per_step=L),
        dict(name="shared.down_proj", N=H, K=inter // tp, dtype="bfloat16", per_step=L),
        dict(name="router", N=cfg.n_routed_experts, K=H, dtype="float32", per_step=L),                       # fp32, replicated
        dict(name="lm_head", N=vocab // tp, K=H, dtype="bfloat16", per_step=1),
    ]

def gemv_kernel_src():
    "Defined on first use, so that importing this script (the CPU tests) does not need Triton's JIT set up."
    import triton, triton.language as tl

    @triton.jit
    def gemv_kernel(x_ptr, w_ptr, o_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                    BLOCK_M:tl.constexpr, BLOCK_N:tl.constexpr, BLOCK_K:tl.constexpr, NUM_STAGES:tl.constexpr,
                    IEEE:tl.constexpr, UPCAST:tl.constexpr):
        "out[M, BLOCK_N] = x[M, K] · W[rows, K]^T for one block of rows: M <= BLOCK_M tokens, fp32 accumulation."
        pid = tl.program_id(0)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        ms = tl.arange(0, BLOCK_M)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            kk = k0 + ks
            x = tl.load(x_ptr + ms[:, None] * stride_xm + kk[None, :], mask=(ms[:, None] < M) & (kk[None, :] < K), other=0.0)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + kk[None, :], mask=(rows[:, None] < N) & (kk[None, :] < K), other=0.0)
            if UPCAST: x, w = x.to(tl.float32), w.to(tl.float32)      # Triton's interpreter: its bf16 dot is wrong
            if IEEE or UPCAST: acc += tl.dot(x, tl.trans(w), input_precision="ieee")   # fp32 weights (the router)
            else: acc += tl.dot(x, tl.trans(w))                                      # [BM, BK] x [BK, BN]
        tl.store(o_ptr + ms[:, None] * stride_om + rows[None, :], acc.to(o_ptr.dtype.element_ty),
                 mask=(ms[:, None] < M) & (rows[None, :] < N))
    return gemv_kernel

_KERNEL = []

def triton_linear(x, w, tile):
    "`x @ w.T` through `gemv_kernel` with `tile` = (BLOCK_N, BLOCK_K, warps, stages); x [M <= 16, K], w [N, K]."
    import torch
    if not _KERNEL: _KERNEL.append(gemv_kernel_src())
    M, K = x.shape; N = w.shape[0]
    if M > 16: raise ValueError(f"triton_linear takes at most 16 tokens, got {M}")
    bn, bk, nw, ns = tile
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _KERNEL[0][(-(-N // bn),)](x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0),
                               BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=ns, IEEE=w.dtype == torch.float32, UPCAST=not x.is_cuda,
                               num_warps=nw)
    return out

METHODS = ("cublas", "triton", "fma", "autotune")
FMA_TILES = ((1, 4096, 8), (2, 4096, 8), (4, 2048, 4), (8, 1024, 4, 2), (4, 128, 1))   # 08h's (BLOCK_N, BLOCK_K, warps[, stages])

def fma_linear(x, w, tile):
    "`x @ w.T` through chapter 08h's `kda_gates_kernel` (one problem); x [M <= 8, K], w [N, K], any float dtype."
    import torch
    kg = kda_gates_module()
    M, K = x.shape; N = w.shape[0]
    if M > kg.MAX_TOKENS: raise ValueError(f"fma_linear takes at most {kg.MAX_TOKENS} tokens, got {M}")
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    kg.gemv_launch([(x, w, out)], M, N, K, tile)
    return out

def run(tokens=(1, 8), methods=METHODS, tiles=TILES, reps:int=20, deadline_s:float=240.0, out_paths=(), device:str="cuda",
        shapes:list|None=None, timer=None, l2_bytes:float=L2_BYTES, max_copies:int=64, fma_tiles=FMA_TILES)->dict:
    """Check each method against fp32, then time it at every shape and token count; returns the result dict (also
    written to `out_paths`). `device`, `shapes`, `timer` exist for the CPU test (Triton's interpreter, a fake timer)."""
    import torch, torch.nn.functional as F
    t0 = time.perf_counter()
    shapes, timer = shapes or dense_shapes(SolarOpen2Config.real()), timer or time_graph
    res = {"schema": 1, "benchmark": "gemv_h200", "command": " ".join([Path(sys.executable).name] + sys.argv),
           "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(0) if device == "cuda" else device,
           "versions": {"torch": torch.__version__, "python": platform.python_version()}, "git_commit": git_commit(ROOT),
           "tp": TP, "shapes": shapes, "tiles": [list(t) for t in tiles], "fma_tiles": [list(t) for t in fma_tiles], "bandwidth_Bps": budget.BANDWIDTH["h200"],
           "timings": [], "checks": [], "skipped": [], "step_us": {}}
    def save():
        for p in out_paths:
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            Path(p).write_text(json.dumps(res, indent=1))
    late = lambda: time.perf_counter() - t0 > deadline_s
    compiled = {}
    if "autotune" in methods:   # one lambda compiled per shape: Dynamo counts them as recompiles of one code object (limit 8)
        import torch._dynamo
        torch._dynamo.config.recompile_limit = torch._dynamo.config.accumulated_recompile_limit = 4096
    def call(method, x, w, tile=None):
        if method == "cublas": return F.linear(x, w)
        if method == "triton": return triton_linear(x, w, tile)
        if method == "fma": return fma_linear(x, w, tile)
        if (x.shape, w.shape, w.dtype) not in compiled:
            compiled[(x.shape, w.shape, w.dtype)] = torch.compile(lambda a, b: F.linear(a, b), mode="max-autotune-no-cudagraphs",
                                                                 dynamic=False, fullgraph=True)
        return compiled[(x.shape, w.shape, w.dtype)](x, w)
    g = torch.Generator(device=device).manual_seed(0)
    for method in methods:                     # method by method: the slow autotune last, so a deadline cuts only it
        for M in tokens:
            for sh in shapes:
                dt = getattr(torch, sh["dtype"])
                nbytes = sh["N"] * sh["K"] * dt.itemsize
                copies = max(1, min(max_copies, int(-(-l2_bytes // nbytes))))
                variants = [(t,) for t in {"triton": tiles, "fma": fma_tiles}.get(method, (None,))]
                keys = [{"tokens": M, "shape": sh["name"], "method": method, "tile": list(t) if t else None} for (t,) in variants]
                if late(): res["skipped"].extend(keys); continue
                ws = [(torch.randn(sh["N"], sh["K"], generator=g, device=device) / sh["K"] ** 0.5).to(dt) for _ in range(copies)]
                xs = [torch.randn(M, sh["K"], generator=g, device=device).to(dt) for _ in range(copies)]
                ref = xs[0].double() @ ws[0].double().T
                best = None
                for (tile,), key in zip(variants, keys):
                    if late(): res["skipped"].append(key); continue
                    try:
                        got = call(method, xs[0], ws[0], tile)
                        err = float((got.double() - ref).norm() / ref.norm())
                        res["checks"].append({**key, "rel_err": err})
                        if not err < (1e-5 if dt == torch.float32 else 2e-2): raise AssertionError(f"relative error {err:.2e}")
                        us = timer([lambda x=x, w=w: call(method, x, w, tile) for x, w in zip(xs, ws)], reps)
                    except Exception as e:                                   # record, keep going
                        res["timings"].append({**key, "error": f"{type(e).__name__}: {e}"[:400]}); save(); continue
                    row = {**key, "us": round(us, 2), "bytes": nbytes, "copies": copies, "TBps": round(nbytes / us / 1e6, 3)}
                    res["timings"].append(row); print(json.dumps(row), flush=True); save()
                    if best is None or row["us"] < best["us"]: best = row
                if best: best["best_of_method"] = True
                del ws, xs
    for M in tokens:
        for method in methods:
            b = {r["shape"]: r["us"] for r in res["timings"] if r.get("best_of_method") and r["tokens"] == M and r["method"] == method}
            if len(b) == len(shapes):
                res["step_us"][f"{method}_M{M}"] = round(sum(s["per_step"] * b[s["name"]] for s in shapes), 1)
    res["step_bytes"] = sum(s["per_step"] * s["N"] * s["K"] * getattr(torch, s["dtype"]).itemsize for s in shapes)
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res

def _methods(s:str)->tuple:
    v = tuple(x for x in s.split(",") if x)
    if not v or set(v) - set(METHODS): raise argparse.ArgumentTypeError(f"expected a subset of {','.join(METHODS)}, got {s!r}")
    return v

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=(1, 8))
    ap.add_argument("--methods", type=_methods, default=METHODS)
    ap.add_argument("--tiles", type=tile_list, default=TILES, help="triton tiles: BLOCK_NxBLOCK_KxWARPSxSTAGES, comma-separated")
    ap.add_argument("--fma-tiles", type=tile_list, default=FMA_TILES, help="fma tiles: BLOCK_NxBLOCK_KxWARPS[xSTAGES], comma-separated")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--deadline-s", type=float, default=240.0, help="start no timing after this many seconds")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("gemv_h200: no CUDA device", file=sys.stderr); return 2
    outs = [RESULTS / "gemv_h200.json"] + ([a.out / "gemv_h200.json"] if a.out else [])
    res = run(a.tokens, a.methods, tiles=a.tiles, fma_tiles=a.fma_tiles, reps=a.reps, deadline_s=a.deadline_s, out_paths=outs)
    for k, v in res["step_us"].items(): print(f"{k}: {v} us per step for {res['step_bytes'] / 1e9:.2f} GB "
                                              f"({res['step_bytes'] / v / 1e6:.2f} TB/s)")
    bad = [r for r in res["timings"] if "error" in r]
    for r in bad: print("error", r, file=sys.stderr)
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
