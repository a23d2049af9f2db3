"""The torch profiler's Chrome trace of a few decode steps: GPU time by kernel family, the top kernels, a step cut
into its layers' segments (a KDA mixer, an attention mixer, a MoE) with the median of each kernel; and
`python -m benchmarks.engine.perf layers TRACE`, which prints those segments."""
from __future__ import annotations
import argparse, gzip, json, re, statistics
from pathlib import Path

# --------------------------------------------------------------------------------------------------------------
# profile summary
# --------------------------------------------------------------------------------------------------------------

KERNEL_FAMILIES = (   # first match wins
    ("allreduce", re.compile(r"nccl|all_?reduce|cross_device_reduce|one_shot|two_shot|multimem|all_?gather|reduce_scatter", re.I)),
    ("moe", re.compile(r"moe|marlin_moe|humming|topk|top_k|expert|align_block|count_and_sort|noaux|fused_experts", re.I)),
    ("kda", re.compile(r"kda|causal_conv1d|fused_recurrent|gated_delta|chunk_|l2norm|layer_norm_gated|layer_norm_fwd_kernel"
                       r"|solve_tril|merge_16x16|recompute_w_u|fused_post_conv|gla_", re.I)),
    ("attention", re.compile(r"flash|fmha|attn|attention|reshape_and_cache|paged", re.I)),
    ("dense_gemm", re.compile(r"gemm|gemv|nvjet|cutlass|cublas|xmma|splitk|marlin|matmul|Kernel2|wgmma", re.I)),
    ("norm_act", re.compile(r"rms_?norm|layer_?norm|silu|act_and_mul|swiglu|sigmoid|softplus|triton_(poi|red|per)_"
                            r"|elementwise|reduce_kernel|fill|copy|cat_|index", re.I)),
    ("sampling", re.compile(r"argmax|sampler|softmax|gumbel|penalt|sort|cumsum|gather|scatter|log_softmax", re.I)),
)
FAMILIES = tuple(f for f, _ in KERNEL_FAMILIES) + ("memcpy", "other")

def classify_kernel(name:str, cat:str="kernel")->str:
    "Kernel family of a GPU trace event."
    if cat in ("gpu_memcpy", "gpu_memset"): return "memcpy"
    for fam, pat in KERNEL_FAMILIES:
        if pat.search(name): return fam
    return "other"

def _busy_us(intervals:list)->float:
    "Length of the union of [start, end) intervals."
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None: total += cur_e - cur_s
            cur_s, cur_e = s, e
        else: cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)

def summarize_trace(trace:dict, steps:int|None=None, top_n:int=25)->dict:
    "Time by kernel family (and the top kernels) of a Chrome trace from the torch profiler; per step when `steps`."
    ev = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    gpu = [e for e in ev if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    ann = [e for e in ev if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("name", "")).startswith("execute_")
           and e.get("cat") in ("user_annotation", "gpu_user_annotation", None)]
    n_steps = steps or len({(e.get("ts"), e.get("name")) for e in ann if e.get("cat") == "user_annotation"}) or None
    fam_us, fam_n, kern = {f: 0.0 for f in FAMILIES}, {f: 0 for f in FAMILIES}, {}
    for e in gpu:
        name, d = str(e.get("name", "")), float(e.get("dur", 0.0))
        f = classify_kernel(name, e["cat"])
        fam_us[f] += d; fam_n[f] += 1
        k = kern.setdefault(name, [f, 0, 0.0]); k[1] += 1; k[2] += d
    total = sum(fam_us.values())
    span = (max(e["ts"] + e.get("dur", 0) for e in gpu) - min(e["ts"] for e in gpu)) if gpu else 0.0
    busy = _busy_us([(e["ts"], e["ts"] + e.get("dur", 0)) for e in gpu])
    per = (lambda v: v / n_steps) if n_steps else (lambda v: None)
    fams = [{"family": f, "us": round(fam_us[f], 1), "share": round(fam_us[f] / total, 4) if total else 0.0,
             "kernels": fam_n[f], "us_per_step": None if per(fam_us[f]) is None else round(per(fam_us[f]), 1)}
            for f in FAMILIES if fam_n[f]]
    fams.sort(key=lambda r: -r["us"])
    top = sorted(kern.items(), key=lambda kv: -kv[1][2])[:top_n]
    return {"steps": n_steps, "kernel_us": round(total, 1), "gpu_span_us": round(span, 1), "gpu_busy_us": round(busy, 1),
            "gpu_busy_fraction": round(busy / span, 4) if span else None,
            "step_us": None if per(span) is None else round(per(span), 1),
            "host_waits": host_waits(trace, n_steps),
            "families": fams,
            "top_kernels": [{"name": n[:160], "family": v[0], "count": v[1], "us": round(v[2], 1),
                             "avg_us": round(v[2] / v[1], 2)} for n, v in top]}

SYNC_CALLS = re.compile(r"^cuda(Event|Stream|Device)Synchronize$")   # the CUDA runtime calls in which the host waits for the GPU

def host_waits(trace:dict, steps:int|None=None, min_us:float=50.0)->dict:
    """The host's waits for the GPU in a trace: the CUDA runtime's synchronize calls of at least `min_us` (a wait that
    short is a check of work already done), their count and time in all and per step, the longest, and by call; and
    the median time from a wait's end to the next graph launch, with the part of it the GPU sits idle."""
    ev = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    w = [e for e in ev if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
         and SYNC_CALLS.match(str(e.get("name", ""))) and float(e.get("dur", 0.0)) >= min_us]
    us = sum(float(e["dur"]) for e in w)
    by = {}
    for e in w:
        b = by.setdefault(e["name"], {"calls": 0, "us": 0.0}); b["calls"] += 1; b["us"] = round(b["us"] + float(e["dur"]), 1)
    # from the end of each wait to the host's next graph launch: the inputs' preparation, and how much of it the GPU
    # spends idle (0 where the previous step's graph still runs meanwhile, all of it where the wait was for that graph)
    gpu = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in ev if isinstance(e, dict)
                 and e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    launches = sorted(float(e["ts"]) for e in ev if isinstance(e, dict) and e.get("ph") == "X"
                      and e.get("cat") == "cuda_runtime" and e.get("name") == "cudaGraphLaunch")
    prep, idle = [], []
    for e in w:
        t0 = float(e["ts"]) + float(e["dur"])
        t1 = next((t for t in launches if t > t0), None)
        if t1 is None: continue
        prep.append(t1 - t0)
        idle.append(t1 - t0 - _busy_us([(max(a, t0), min(b, t1)) for a, b in gpu if b > t0 and a < t1]))
    med = lambda v: round(statistics.median(v), 1) if v else None
    return {"min_us": min_us, "calls": len(w), "us": round(us, 1), "us_per_step": round(us / steps, 1) if steps else None,
            "longest_us": round(max((float(e["dur"]) for e in w), default=0.0), 1), "by_call": by,
            "prep_after_wait_us": med(prep), "gpu_idle_in_prep_us": med(idle)}

SEGMENT_KINDS = (("kda mixer", re.compile(r"gated_delta_rule|chunk_kda|kda_", re.I)),
                 ("attention mixer", re.compile(r"flash|attention|attn", re.I)),
                 ("moe", re.compile(r"topk|top_k|moe|marlin|expert", re.I)))

# where a TP1 trace (--config rank) is cut into layers: the residual add + RMSNorm after each mixer and each MoE,
# which at TP > 1 is fused into the all-reduce
NORM_CUT = re.compile(r"add_rms_norm|fused_add_rms", re.I)

def is_cut(name:str, cat:str, cut:str)->bool:
    "Whether kernel `name` ends a segment: an all-reduce (`cut='allreduce'`) or a residual add + RMSNorm (`cut='norm'`)."
    if cut == "allreduce": return classify_kernel(name, cat) == "allreduce"
    if cut == "norm": return bool(NORM_CUT.search(name))
    raise ValueError(f"cut must be 'allreduce' or 'norm', got {cut!r}")

def layer_segments(trace:dict, min_segments:int=2, cut:str="auto")->dict:
    """A decode step's GPU kernels cut at every all-reduce (at TP1, with none in the trace: every residual add +
    RMSNorm; `cut` forces either) into the pieces between them: a KDA or attention mixer, or
    a MoE, each named by the kernels it holds. Per kind, the most common kernel sequence (its `signature`), with the
    median duration and the stream of each kernel over the segments that have it, the median sum of kernel time and
    the median span from the first start to the last end (kernels on a second stream overlap; gaps count)."""
    ev = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    gpu = sorted((e for e in ev if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    if cut == "auto":
        cut = "allreduce" if any(is_cut(str(e.get("name", "")), e["cat"], "allreduce") for e in gpu) else "norm"
    segs, cur = [], None
    for e in gpu:
        if is_cut(str(e.get("name", "")), e["cat"], cut):
            if cur: segs.append(cur)
            cur = []
        elif cur is not None: cur.append(e)
    kinds = {}
    for seg in segs:
        names = " ".join(str(e.get("name", "")) for e in seg)
        kind = next((k for k, pat in SEGMENT_KINDS if pat.search(names)), None)
        if kind: kinds.setdefault(kind, []).append(seg)
    med = lambda v: statistics.median(v) if v else None
    out = {}
    for kind, ss in kinds.items():
        sig = lambda seg: tuple(str(e.get("name", ""))[:80] for e in seg)
        counts = {}
        for seg in ss: counts[sig(seg)] = counts.get(sig(seg), 0) + 1
        best, n = max(counts.items(), key=lambda kv: kv[1])
        if n < min_segments: continue
        same = [seg for seg in ss if sig(seg) == best]
        out[kind] = {"segments": len(ss), "with_signature": n,
                     "kernel_us": round(med([sum(float(e.get("dur", 0)) for e in seg) for seg in same]), 2),
                     "span_us": round(med([max(e["ts"] + e.get("dur", 0) for e in seg) - seg[0]["ts"] for seg in same]), 2),
                     "kernels": [{"name": best[i], "stream": same[0][i].get("args", {}).get("stream"),
                                  "us": round(med([float(seg[i].get("dur", 0)) for seg in same]), 2)} for i in range(len(best))]}
    return out

def load_trace(path:Path)->dict:
    "A Chrome trace, gzipped or not."
    op = gzip.open if str(path).endswith(".gz") else open
    with op(path, "rt") as f: return json.load(f)

def find_traces(d:Path)->list:
    "Trace files in the profiler directory, rank 0 first."
    fs = sorted(Path(d).glob("*.pt.trace.json*")) + sorted(Path(d).glob("*/*.pt.trace.json*"))
    return sorted(fs, key=lambda p: (not re.search(r"(tp0|rank0|rank_0)(\D|$)", p.name), p.name))

def compare_profile(summary:dict, predicted:dict)->list:
    "Measured µs per step per family next to the bytes-per-token model's µs."
    meas = {r["family"]: r["us_per_step"] for r in summary.get("families", [])}
    rows = []
    for f in ("dense_gemm", "moe", "kda", "attention", "allreduce", "norm_act", "sampling", "memcpy", "other"):
        m, p = meas.get(f), predicted.get(f)
        rows.append({"family": f, "measured_us_per_step": m, "predicted_us_per_step": None if p is None else round(p, 1),
                     "measured_over_predicted": round(m / p, 2) if m and p else None})
    return rows

def cli_layers(argv:list)->int:
    "`layers TRACE`: the kernels of each kind of segment between two all-reduces (or norms, at TP1), as a table."
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine.perf layers", description=cli_layers.__doc__)
    ap.add_argument("trace", type=Path, help="a torch-profiler Chrome trace (.json or .json.gz), e.g. one kept by --keep-trace")
    a = ap.parse_args(argv)
    if not a.trace.exists(): ap.error(f"no such trace file: {a.trace}")
    for kind, seg in layer_segments(load_trace(a.trace)).items():
        print(f"{kind}: {seg['segments']} segments, {seg['with_signature']} with the sequence below; median kernels "
              f"{seg['kernel_us']} us, span {seg['span_us']} us")
        for k in seg["kernels"]: print(f"  {k['us']:8.2f} us  stream {k['stream']}  {k['name']}")
    return 0
