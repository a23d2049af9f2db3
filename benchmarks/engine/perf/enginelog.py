"""What the benchmark reads from vLLM's engine log (every process's output, captured at the file-descriptor level):
the KV pool vLLM sized, the backends it chose, start-up times, Triton's autotuning, errors; and the KV pool against
the budget chapter's prediction."""
from __future__ import annotations
import re

# --------------------------------------------------------------------------------------------------------------
# the engine log
# --------------------------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE = re.compile(r"^(?:\((?P<proc>[^()]*?) pid=(?P<pid>\d+)\)\s+)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
                   r"\d\d-\d\d \d\d:\d\d:\d\d\s+\[(?P<src>[^\]]+)\]\s+(?P<msg>.*)$")
_PATTERNS = {
    "kv_cache_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
    "nvfp4_moe_backend": re.compile(r"Using '([A-Za-z0-9_]+)' NvFp4 MoE backend out of potential backends: \[(.*?)\]"),
    "moe_backend_any": re.compile(r"Using '?([A-Za-z0-9_]+)'? (\w+) MoE backend"),
    "attention_backend": re.compile(r"Using (\w+) attention backend"),
    "block_size": re.compile(r"Setting attention block size to (\d+) tokens"),
    "mamba_padding_pct": re.compile(r"Padding mamba page size by ([\d.]+)%"),
    "model_loading": re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds"),
    "kv_reserved": re.compile(r"Initial free memory ([\d.]+) GiB, reserved ([\d.]+) GiB memory for KV Cache"),
    "available_kv": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "graph_capture": re.compile(r"Graph capturing finished in (\d+) secs, took ([\d.]+) GiB"),
    "init_engine": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s(?: \(compilation: ([\d.]+) s)?"),
    "torch_compile": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "dynamo": re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"),
    "async_scheduling": re.compile(r"Asynchronous scheduling is (\w+)"),
    "allreduce_backends": re.compile(r"Using \[(.*?)\] all-reduce backends \(in dispatch order\) for group '([^']*)'"),
    "nccl_version": re.compile(r"vLLM is using nccl==(\S+)"),
    "dummy_weights": re.compile(r"solar_open2: dummy weights (\S+: .*)"),     # the load format's one line (vllm/dummy)
    "engine_config": re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)"),
    "allreduce_fusion_off": re.compile(r"(Flashinfer is not installed or comm module not found|AllReduce fusion pass is "
                                       r"disabled|Failed to initialize Flashinfer allreduce workspace|Flashinfer allreduce "
                                       r"fusion is not supported)"),
}
_COMM = re.compile(r"all.?reduce|custom.?ar\b|symm.?mem|nccl", re.I)
_PROC = re.compile(r"^\([^()]*? pid=\d+\)\s?")
_AUTOTUNE = re.compile(r"Triton autotuning for function (\w+),\s*with key as .*?,\s*finished after ([\d.]+)s", re.S)

def autotune_summary(text:str, top:int=12)->dict:
    """Triton's autotuning in an engine log (`TRITON_PRINT_AUTOTUNING=1` prints one block per tuned key, not cached
    ones): how many, how long in all, and the functions that took longest (per process, so TP ranks add up)."""
    plain = "\n".join(_PROC.sub("", _ANSI.sub("", l).replace("\r", "")) for l in text.splitlines())
    by = {}
    for name, sec in _AUTOTUNE.findall(plain):
        n, t = by.get(name, (0, 0.0)); by[name] = (n + 1, t + float(sec))
    worst = sorted(by.items(), key=lambda kv: -kv[1][1])[:top]
    return {"runs": sum(n for n, _ in by.values()), "seconds": round(sum(t for _, t in by.values()), 2),
            "by_function": {k: {"runs": n, "seconds": round(t, 2)} for k, (n, t) in worst}}

def log_records(text:str)->list:
    "vLLM log lines as dicts (proc, pid, level, src, msg); other lines are skipped."
    out = []
    for raw in text.splitlines():
        m = _LINE.match(_ANSI.sub("", raw).replace("\r", "").strip())
        if m: out.append(m.groupdict())
    return out

def parse_engine_log(text:str)->dict:
    "The facts the benchmark needs from an engine log (every field None/[] when its line is absent)."
    r = {"kv_cache_tokens": None, "max_concurrency": None, "max_concurrency_len": None, "nvfp4_moe_backend": None,
         "nvfp4_moe_candidates": [], "moe_backends": [], "attention_backends": [], "block_size": None,
         "mamba_padding_pct": None, "model_loading": [], "kv_reserved_gib": None, "initial_free_gib": None,
         "available_kv_gib": None, "graph_capture_s": None, "graph_capture_gib": None, "init_engine_s": None,
         "compilation_s": None, "torch_compile_s": None, "dynamo_s": None, "async_scheduling": None,
         "vllm_version_logged": None, "engine_config": None, "allreduce_backends": {}, "nccl_version": None,
         "allreduce_fusion_off": [], "dummy_weights": None, "errors": [], "n_warnings": 0, "comm_lines": []}
    for rec in log_records(text):
        msg, proc = rec["msg"], rec["proc"] or "main"
        if rec["level"] in ("ERROR", "CRITICAL") and len(r["errors"]) < 10: r["errors"].append(f"{proc}: {msg[:300]}")
        if rec["level"] == "WARNING": r["n_warnings"] += 1
        if _COMM.search(msg) and len(r["comm_lines"]) < 8: r["comm_lines"].append(f"{proc}: {msg[:240]}")
        for key, pat in _PATTERNS.items():
            m = pat.search(msg)
            if not m: continue
            g = m.groups()
            if key == "kv_cache_tokens": r[key] = int(g[0].replace(",", ""))
            elif key == "max_concurrency": r["max_concurrency_len"], r[key] = int(g[0].replace(",", "")), float(g[1])
            elif key == "nvfp4_moe_backend":
                if r[key] is None: r[key], r["nvfp4_moe_candidates"] = g[0], re.findall(r"'([^']+)'", g[1])
                elif r[key] != g[0]: r["errors"].append(f"{proc}: NvFp4 MoE backend {g[0]} differs from {r[key]}")
            elif key == "moe_backend_any":
                if (g[0], g[1]) not in [tuple(x) for x in r["moe_backends"]]: r["moe_backends"].append([g[0], g[1]])
            elif key == "attention_backend":
                if g[0] not in r["attention_backends"]: r["attention_backends"].append(g[0])
            elif key == "block_size": r[key] = int(g[0])
            elif key == "mamba_padding_pct": r[key] = float(g[0])
            elif key == "model_loading": r[key].append({"proc": proc, "gib": float(g[0]), "seconds": float(g[1])})
            elif key == "kv_reserved": r["initial_free_gib"], r["kv_reserved_gib"] = float(g[0]), float(g[1])
            elif key == "available_kv": r["available_kv_gib"] = float(g[0])
            elif key == "graph_capture": r["graph_capture_s"], r["graph_capture_gib"] = float(g[0]), float(g[1])
            elif key == "init_engine": r["init_engine_s"], r["compilation_s"] = float(g[0]), (float(g[1]) if g[1] else None)
            elif key == "torch_compile": r["torch_compile_s"] = float(g[0])
            elif key == "dynamo": r["dynamo_s"] = float(g[0])
            elif key == "async_scheduling": r[key] = g[0]
            elif key == "allreduce_backends": r[key].setdefault(g[1], re.findall(r"'([^']+)'", g[0]))
            elif key == "nccl_version": r[key] = g[0]
            elif key == "dummy_weights": r[key] = r[key] or g[0][:400]
            elif key == "engine_config": r["vllm_version_logged"], r[key] = g[0], g[1][:3000]
            elif key == "allreduce_fusion_off":
                if g[0] not in r[key]: r[key].append(g[0])                  # why vLLM left the fusion pass out
    r["autotune"] = autotune_summary(text)
    return r


# KV pool: prediction vs log
# --------------------------------------------------------------------------------------------------------------

def compare_kv(pred:dict, logged:dict)->dict:
    "Exact comparison of the logged KV pool with the prediction (None where the line is missing)."
    tok, conc = logged.get("kv_cache_tokens"), logged.get("max_concurrency")
    out = {"predicted_tokens": pred["gpu_kv_cache_tokens"], "logged_tokens": tok,
           "predicted_concurrency": pred["max_concurrency_2dp"], "logged_concurrency": conc,
           "predicted_block_size": pred["block_size"], "logged_block_size": logged.get("block_size"),
           "tokens_match": None if tok is None else tok == pred["gpu_kv_cache_tokens"],
           "concurrency_match": None if conc is None else abs(conc - pred["max_concurrency_2dp"]) < 1e-9,
           "block_size_match": None if logged.get("block_size") is None else logged["block_size"] == pred["block_size"]}
    checks = [out["tokens_match"], out["concurrency_match"]]
    out["match"] = None if None in checks else all(checks)
    return out
