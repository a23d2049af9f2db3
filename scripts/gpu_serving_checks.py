#!/usr/bin/env python
"""GPU checks of the serving chapter's prefix caching and FP8 KV budget, on one H200 (writes JSON).

    python scripts/gpu_serving_checks.py prefix [--modes eager graphs] [--format compressed-tensors] [--tokens 32]
    python scripts/gpu_serving_checks.py kv [--cases fp8:28g:1M fp8:8g:256K fp8+pc:28g:1M fp8+pc:8g:256K]
    python scripts/gpu_serving_checks.py expect       # no GPU: the numbers and log lines the two jobs must see

`prefix`: the tiny checkpoint (`solar_open2.checkpoint.make_tiny`) at TP1, one fresh engine per (mode, prefix caching
on/off). Request A is a shared prefix of 3 KV blocks plus its own suffix, request B the same prefix plus another
suffix, sent after A. With `enable_prefix_caching` vLLM runs the KDA state in mamba cache mode `align`; B must report
exactly the cache hit the budget chapter predicts (`align_saved_boundaries` / `prefix_hit_tokens`: the prefix, 816
tokens at the tiny model's 272-token block), in its `num_cached_tokens` and in the `vllm:prefix_cache_hits` counter,
and its greedy tokens must equal B's with caching off and the fp32 reference's argmax on B's sequence (near-ties
apart), in eager mode and with CUDA graphs, which must also agree with each other.

`kv`: the FP8 KV pool of one TP2 rank of the real model. `budget.rank_config(real, 2)` served at TP1 with dummy
weights has exactly the per-rank KV layout of the real model at TP2 (KV heads 8/2, KDA heads 64/2: the same state
page, block and page bytes; the budget chapter tests that the plans are identical), so the published pools need no
scaling: 28e9 at 1M and 8e9 at 256K, with and without prefix caching, run as they are (71.6 GiB of weights + at most
26 GiB of pool on a 140 GiB H200). Each case boots an engine (eager: the KV numbers do not depend on graphs), reads
vLLM's "Setting attention block size", "GPU KV cache size" and "Maximum concurrency" lines and the engine's
`num_gpu_blocks`, and compares them exactly with `solar_open2.budget.plan` for TP2 of the real model.

Writes `<name>.json` (default `gpu_serving_<job>.json`) and one engine log per run into --out (default: $OUT if set,
else benchmarks/results/incoming/); exit 1 if a check fails, 2 without a GPU. The plugin is made visible to vLLM's processes as
the GPU parity run (`benchmarks.engine.parity`) does (installed entry point, else a throw-away dist-info on PYTHONPATH).
"""
from __future__ import annotations
import argparse, json, os, platform, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from benchmarks.engine import parity as gp                  # noqa: E402  (prompt-free helpers: reference, compare, shim)
from solar_open2 import budget                              # noqa: E402
from solar_open2.config import SolarOpen2Config             # noqa: E402

MODES = ("eager", "graphs")
KV_CASES = ("fp8:28g:1M", "fp8:8g:256K", "fp8+pc:28g:1M", "fp8+pc:8g:256K")
PREFIX_BLOCKS = 3            # the shared prefix, in KV blocks
SUFFIX_A, SUFFIX_B = 40, 56  # the two requests' own tokens after it
MAX_NUM_BATCHED_TOKENS = 2048
PREFIX_MAX_MODEL_LEN = 2048


# ---- what to expect (CPU) -----------------------------------------------------------------------------------------

def parse_kv_case(case: str) -> dict:
    "`DTYPE[+pc]:POOL:LEN` (vLLM notation for POOL and LEN) -> kv dtype, prefix caching, pool bytes, max_model_len."
    try: kind, pool, length = case.split(":")
    except ValueError: raise ValueError(f"--cases: {case!r} is not DTYPE[+pc]:POOL:LEN, e.g. fp8+pc:28g:1M") from None
    kvd, _, pc = kind.partition("+")
    if pc not in ("", "pc"): raise ValueError(f"--cases: {case!r}: only '+pc' (prefix caching) may follow the dtype")
    budget.kv_dtype_bytes(kvd)
    return dict(case=case, kv_cache_dtype=kvd, prefix_caching=pc == "pc", kv_cache_memory_bytes=budget.parse_size(pool),
                max_model_len=budget.parse_size(length))


def kv_expectation(c: dict) -> dict:
    "The budget's TP2 numbers for one case, and the same plan for the TP1 rank model (they must be one and the same)."
    kw = dict(kv_cache_memory_bytes=c["kv_cache_memory_bytes"], max_model_len=c["max_model_len"],
              kv_cache_dtype=c["kv_cache_dtype"], prefix_caching=c["prefix_caching"], max_num_seqs=8, spark_headroom=False)
    real, rank = budget.plan(tp=2, **kw), budget.plan(tp=1, cfg=budget.rank_config(SolarOpen2Config.real(), 2), **kw)
    keys = ("block_size", "num_blocks", "gpu_kv_cache_tokens", "log_lines")
    same = all(getattr(real, k) == getattr(rank, k) for k in keys) and real.layout.page_bytes == rank.layout.page_bytes
    return {"block_size": real.block_size, "num_blocks": real.num_blocks, "page_bytes": real.layout.page_bytes,
            "gpu_kv_cache_tokens": real.gpu_kv_cache_tokens, "max_concurrency_2dp": round(real.max_concurrency, 2),
            "log_lines": real.log_lines, "blocks_per_request": real.blocks_per_request, "fits": real.fits,
            "rank_model_plan_identical": same}


def prefix_expectation(cfg: SolarOpen2Config, kv_cache_dtype: str = "auto") -> dict:
    "Block size, prompt lengths and the hit B must report, from the budget chapter's replay of align mode."
    block = budget.kv_layout(cfg, 1, kv_cache_dtype, prefix_caching=True).block_size
    shared = PREFIX_BLOCKS * block
    la, lb = shared + SUFFIX_A, shared + SUFFIX_B
    saved = budget.align_saved_boundaries(la, block, MAX_NUM_BATCHED_TOKENS)
    return {"block_size": block, "shared_tokens": shared, "len_a": la, "len_b": lb, "saved_after_a": saved,
            "hit_b": budget.prefix_hit_tokens(saved, shared, lb)}


def prefix_prompts(exp: dict, vocab: int, first: int = 142) -> tuple:
    "Deterministic token ids: A = shared + suffix a, B = shared + suffix b (the suffixes differ from their first token)."
    tok = lambda i, a, b: first + (a * i * i + b * i) % (vocab - first)
    shared = [tok(i, 7, 3) for i in range(exp["shared_tokens"])]
    a = shared + [tok(i, 13, 5) for i in range(SUFFIX_A)]
    b = shared + [tok(i, 29, 11) for i in range(1, SUFFIX_B + 1)]
    assert a[exp["shared_tokens"]] != b[exp["shared_tokens"]]
    return a, b


# ---- children: one engine each ------------------------------------------------------------------------------------

def _metric_total(llm, name: str):
    try: return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == name)
    except Exception: return None


def child_prefix(a) -> dict:
    from vllm import LLM, SamplingParams
    a_ids, b_ids = json.loads(Path(a.child_prompts).read_text())
    kw = dict(model=a.child_model, tokenizer=a.child_model, skip_tokenizer_init=True, dtype="bfloat16", seed=0,
              max_model_len=PREFIX_MAX_MODEL_LEN, max_num_seqs=4, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
              gpu_memory_utilization=a.gpu_memory_utilization or 0.3, enable_prefix_caching=a.child_pc == "on",
              disable_log_stats=False)
    if a.kv_cache_memory_bytes: kw["kv_cache_memory_bytes"] = a.kv_cache_memory_bytes   # skips profiling: a shared GPU
    if a.child_mode == "eager": kw["enforce_eager"] = True
    else: kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8]}
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True, detokenize=False, logprobs=gp.TOPK)
    out, hits = {}, {}
    for name, ids in (("a", a_ids), ("b", b_ids)):                       # one after the other: A's states are cached first
        (o,) = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
        c = o.outputs[0]
        out[name] = {"tokens": list(c.token_ids), "logprobs": [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
                     "topk": [{int(i): float(x.logprob) for i, x in lp.items()} for lp in c.logprobs],
                     "num_cached_tokens": o.num_cached_tokens}
        hits[name] = {"hits": _metric_total(llm, "vllm:prefix_cache_hits"), "queries": _metric_total(llm, "vllm:prefix_cache_queries")}
    cc = llm.llm_engine.vllm_config.cache_config
    return {**out, "metrics_after": hits, "block_size": cc.block_size, "mamba_block_size": cc.mamba_block_size,
            "mamba_cache_mode": cc.mamba_cache_mode, "enable_prefix_caching": cc.enable_prefix_caching,
            "splitting_ops": llm.llm_engine.vllm_config.compilation_config.splitting_ops}


def child_kv(a) -> dict:
    from vllm import LLM
    c = parse_kv_case(a.child_case)
    kw = dict(model=a.child_model, skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16", seed=0,
              max_model_len=c["max_model_len"], kv_cache_memory_bytes=c["kv_cache_memory_bytes"],
              kv_cache_dtype=c["kv_cache_dtype"], enable_prefix_caching=c["prefix_caching"], enforce_eager=True,
              max_num_seqs=8, max_num_batched_tokens=8192)
    if a.gpu_memory_utilization: kw["gpu_memory_utilization"] = a.gpu_memory_utilization   # only the start-up free-memory check
    if a.moe_backend != "auto": kw["moe_backend"] = a.moe_backend
    if a.attention_backend: kw["attention_config"] = {"backend": a.attention_backend}
    t = time.perf_counter()
    llm = LLM(**kw)
    cc = llm.llm_engine.vllm_config.cache_config
    return {"init_s": round(time.perf_counter() - t, 1), "block_size": cc.block_size, "num_gpu_blocks": cc.num_gpu_blocks,
            "mamba_cache_mode": cc.mamba_cache_mode, "mamba_page_size_padded": cc.mamba_page_size_padded}


# ---- judging (CPU-testable) ---------------------------------------------------------------------------------------

def judge_prefix(runs: dict, exp: dict, cmps: dict) -> list:
    """Failures of the prefix job. `runs[(mode, pc)]`: a child's result; `cmps[(mode, pc, req)]`: `gp.compare` of that
    request against the fp32 reference."""
    fails = []
    for (mode, pc), r in runs.items():
        tag = f"{mode}, prefix caching {pc}"
        if pc == "on":
            if r["mamba_cache_mode"] != "align": fails.append(f"{tag}: mamba cache mode {r['mamba_cache_mode']!r}, not 'align'")
            if r["block_size"] != exp["block_size"]: fails.append(f"{tag}: block size {r['block_size']}, budget {exp['block_size']}")
            if r["a"]["num_cached_tokens"] != 0: fails.append(f"{tag}: A reports {r['a']['num_cached_tokens']} cached tokens, expected 0")
            if r["b"]["num_cached_tokens"] != exp["hit_b"]:
                fails.append(f"{tag}: B reports {r['b']['num_cached_tokens']} cached tokens, the budget predicts {exp['hit_b']}")
            h = [r["metrics_after"][k]["hits"] for k in ("a", "b")]
            if None not in h and h[1] - h[0] != exp["hit_b"]:
                fails.append(f"{tag}: vllm:prefix_cache_hits grew by {h[1] - h[0]} for B, expected {exp['hit_b']}")
        elif r["b"]["num_cached_tokens"]:
            fails.append(f"{tag}: B reports {r['b']['num_cached_tokens']} cached tokens with caching off")
        for req in ("a", "b"):
            c = cmps.get((mode, pc, req))
            if c and c["mismatches"]: fails.append(f"{tag}: {req.upper()}'s tokens differ from the fp32 reference's argmax at {c['mismatches']}")
    for mode in {m for m, _ in runs}:
        on, off = runs.get((mode, "on")), runs.get((mode, "off"))
        if on and off:
            for req in ("a", "b"):
                if on[req]["tokens"] != off[req]["tokens"]: fails.append(f"{mode}: {req.upper()}'s tokens differ with caching on and off")
    if ("eager", "on") in runs and ("graphs", "on") in runs:
        for req in ("a", "b"):
            if runs[("eager", "on")][req]["tokens"] != runs[("graphs", "on")][req]["tokens"]:
                fails.append(f"prefix caching on: {req.upper()}'s tokens differ between eager and CUDA graphs")
    return fails


def judge_kv(case: str, exp: dict, logged: dict, engine: dict) -> list:
    "Failures of one kv case: vLLM's logged lines and its block count against the budget, exactly."
    fails = []
    if not exp["rank_model_plan_identical"]: fails.append(f"{case}: the rank model's plan differs from TP2's (no GPU needed)")
    for key, got, want in (("block size (log)", logged.get("block_size"), exp["block_size"]),
                           ("block size (engine)", engine.get("block_size"), exp["block_size"]),
                           ("num_gpu_blocks", engine.get("num_gpu_blocks"), exp["num_blocks"]),
                           ("GPU KV cache size", logged.get("kv_cache_tokens"), exp["gpu_kv_cache_tokens"]),
                           ("maximum concurrency", logged.get("max_concurrency"), exp["max_concurrency_2dp"])):
        if got != want: fails.append(f"{case}: {key} {got}, the budget predicts {want}")
    return fails


# ---- parents -----------------------------------------------------------------------------------------------------

def _env(work: Path) -> tuple:
    installed = gp.plugin_entry_point()
    paths = [str(ROOT)] + ([] if installed else [str(gp.entry_point_shim(work / "shim"))])
    env = {**os.environ, **gp.ENV, "PYTHONPATH": os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    return env, "installed" if installed else "shim dist-info on PYTHONPATH"


def _memory_flags(a) -> list:
    "The memory options, passed on to each engine's process."
    return ((["--gpu-memory-utilization", str(a.gpu_memory_utilization)] if a.gpu_memory_utilization else [])
            + (["--kv-cache-memory-bytes", str(a.kv_cache_memory_bytes)] if a.kv_cache_memory_bytes else []))


def _child(args: list, env: dict, log: Path, timeout: float) -> subprocess.CompletedProcess:
    try: r = subprocess.run([sys.executable, __file__, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        txt = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        r = subprocess.CompletedProcess(e.cmd, 124, txt(e.stdout), txt(e.stderr) + "\n[gpu_serving_checks: timed out]")
    log.write_text(r.stdout + r.stderr)
    return r


def _report(job: str, a, extra: dict) -> dict:
    import torch, vllm
    from benchmarks.common import git_commit, git_dirty, source_digest
    return {"job": job, "command": " ".join([Path(sys.executable).name] + sys.argv), "gpu": torch.cuda.get_device_name(0),
            "git_commit": git_commit(ROOT), "git_dirty": git_dirty(ROOT), "source_sha256": source_digest(ROOT),
            "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version()},
            **extra, "runs": {}, "failures": []}


def main_prefix(a) -> int:
    from solar_open2.checkpoint import make_tiny
    t0, work = time.time(), Path(a.workdir or tempfile.mkdtemp(prefix="solar_serving_"))
    ck = work / f"tiny_{a.format.replace('-', '_')}"
    if not (ck / "config.json").exists(): make_tiny(ck, format=a.format)
    cfg = SolarOpen2Config.from_pretrained(ck)
    exp = prefix_expectation(cfg)
    a_ids, b_ids = prefix_prompts(exp, cfg.vocab_size)
    (work / "prompts.json").write_text(json.dumps([a_ids, b_ids]))
    env, how = _env(work)
    rep = _report("prefix", a, {"format": a.format, "tokens": a.tokens, "expected": exp, "plugin_entry_point": how})
    runs, cmps, ref = {}, {}, None
    for mode in a.modes:
        for pc in ("on", "off"):
            key = f"{mode}:prefix_caching_{pc}"
            if time.time() - t0 > a.deadline_s: rep["failures"].append(f"{key}: not run (deadline)"); continue
            outf = work / f"{mode}_{pc}.json"
            r = _child(["--child-job", "prefix", "--child-model", str(ck), "--child-mode", mode, "--child-pc", pc,
                        "--child-prompts", str(work / "prompts.json"), "--child-out", str(outf), "--tokens", str(a.tokens)]
                       + _memory_flags(a),
                       env, Path(a.out) / f"{a.name}_{mode}_{pc}.log", max(60, a.deadline_s - (time.time() - t0) + 60))
            if r.returncode: rep["failures"].append(f"{key}: vLLM run failed (rc {r.returncode}): {(r.stderr or r.stdout)[-600:]}"); continue
            res = runs[(mode, pc)] = json.loads(outf.read_text())
            if ref is None: ref = gp.load_reference(ck, "cuda", "float32")
            for req, ids in (("a", a_ids), ("b", b_ids)): cmps[(mode, pc, req)] = gp.compare(ref, ids, res[req], "cuda", a.tie_nats)
            rep["runs"][key] = {**{k: res[k] for k in ("block_size", "mamba_block_size", "mamba_cache_mode", "metrics_after")},
                                **{f"{q}_num_cached_tokens": res[q]["num_cached_tokens"] for q in ("a", "b")},
                                **{f"{q}_tokens": res[q]["tokens"] for q in ("a", "b")},
                                **{f"{q}_vs_fp32_reference": {k: cmps[(mode, pc, q)][k] for k in ("mismatches", "near_ties", "max_abs_dlogprob", "mean_abs_dlogprob", "min_top2_margin")} for q in ("a", "b")}}
    for mode in a.modes:
        on, off = runs.get((mode, "on")), runs.get((mode, "off"))
        if on and off:
            rep["runs"][f"{mode}:b_on_vs_off"] = {"same_tokens": on["b"]["tokens"] == off["b"]["tokens"],
                                                 "max_abs_dlogprob": max(abs(x - y) for x, y in zip(on["b"]["logprobs"], off["b"]["logprobs"]))}
    rep["failures"] += judge_prefix(runs, exp, cmps)
    return _finish(rep, a, t0)


def main_kv(a) -> int:
    from benchmarks.engine import perf as ph               # the engine-log parser and the rank model's config.json
    t0, work = time.time(), Path(a.workdir or tempfile.mkdtemp(prefix="solar_serving_"))
    model = ph.write_model_dir("rank", Path(a.model_dir) if a.model_dir else ph.stable_model_dir("rank"))
    env, how = _env(work)
    rep = _report("kv", a, {"model": "budget.rank_config(real, 2) at TP1, dummy weights", "plugin_entry_point": how,
                            "moe_backend": a.moe_backend, "attention_backend": a.attention_backend})
    for case in a.cases:
        c = parse_kv_case(case); exp = kv_expectation(c)
        rec = rep["runs"][case] = {"expected": exp}
        if time.time() - t0 > a.deadline_s: rep["failures"].append(f"{case}: not run (deadline)"); continue
        outf = work / f"kv_{case.replace(':', '_').replace('+', '_')}.json"
        log = Path(a.out) / f"{a.name}_{case.replace(':', '_').replace('+', '_')}.log"
        r = _child(["--child-job", "kv", "--child-model", str(model), "--child-case", case, "--child-out", str(outf),
                    "--moe-backend", a.moe_backend] + _memory_flags(a) + (["--attention-backend", a.attention_backend] if a.attention_backend else []),
                   env, log, max(60, a.deadline_s - (time.time() - t0) + 60))
        logged = ph.parse_engine_log(r.stdout + r.stderr)
        rec["logged"] = {k: logged.get(k) for k in ("block_size", "mamba_padding_pct", "kv_cache_tokens", "max_concurrency",
                                                     "max_concurrency_len", "attention_backends", "nccl_version", "errors")}
        if r.returncode:
            rep["failures"].append(f"{case}: vLLM run failed (rc {r.returncode}): {(r.stderr or r.stdout)[-600:]}")
            if logged.get("kv_cache_tokens") is None: continue          # the lines may have come before the failure
            engine = {}
        else: engine = rec["engine"] = json.loads(outf.read_text())
        rep["failures"] += judge_kv(case, exp, logged, engine)
    return _finish(rep, a, t0)


def _finish(rep: dict, a, t0: float) -> int:
    rep["wall_s"] = round(time.time() - t0, 1); rep["passed"] = not rep["failures"]
    (Path(a.out) / f"{a.name}.json").write_text(json.dumps(rep, indent=1) + "\n")
    print(json.dumps({"passed": rep["passed"], "failures": rep["failures"], "wall_s": rep["wall_s"]}, indent=1))
    return 0 if rep["passed"] else 1


def main_expect(a) -> int:
    out = {"prefix": prefix_expectation(SolarOpen2Config.tiny()),
           "kv": {case: kv_expectation(parse_kv_case(case)) for case in (a.cases or KV_CASES)}}
    print(json.dumps(out, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", nargs="?", choices=("prefix", "kv", "expect"))
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--format", choices=("compressed-tensors", "bf16"), default="compressed-tensors", help="prefix: the tiny checkpoint's format")
    ap.add_argument("--tokens", type=int, default=32, help="prefix: greedy tokens per request")
    ap.add_argument("--tie-nats", type=float, default=0.05, help="prefix: a reference top-2 margin below this is a near-tie")
    ap.add_argument("--cases", nargs="+", help=f"kv: DTYPE[+pc]:POOL:LEN (default: {' '.join(KV_CASES)})")
    ap.add_argument("--moe-backend", default="auto"); ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="vLLM's gpu_memory_utilization (default: prefix 0.3, kv vLLM's own; with a fixed pool it only sets "
                    "the free memory vLLM demands at start-up, so lower it when other checks share the GPU)")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                    help="prefix: a fixed KV pool in bytes (skips vLLM's memory profiling, which other engines on the "
                    "GPU upset); not for kv, whose cases name their pools")
    ap.add_argument("--model-dir", help="kv: where the rank model's config.json goes (default: a fixed temp path)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results" / "incoming"))
    ap.add_argument("--name", default=None, help="JSON report name (default: gpu_serving_<job>)")
    ap.add_argument("--workdir", default=None); ap.add_argument("--deadline-s", type=float, default=540)
    for k in ("job", "model", "mode", "pc", "prompts", "case", "out"): ap.add_argument(f"--child-{k}")
    return ap


def main(argv: list | None = None) -> int:
    ap = build_parser(); a = ap.parse_args(argv)
    if a.child_job:
        res = child_prefix(a) if a.child_job == "prefix" else child_kv(a)
        Path(a.child_out).write_text(json.dumps(res)); return 0
    if a.job is None: ap.error("a job is required: prefix, kv or expect")
    try:
        for c in a.cases or (): parse_kv_case(c)
    except ValueError as e: ap.error(str(e))
    if a.job == "kv" and a.kv_cache_memory_bytes: ap.error("--kv-cache-memory-bytes: the kv cases name their own pools (--cases)")
    if a.job == "expect": return main_expect(a)
    import torch
    if not torch.cuda.is_available(): print("gpu_serving_checks: no CUDA device", file=sys.stderr); return 2
    a.cases, a.name = a.cases or list(KV_CASES), a.name or f"gpu_serving_{a.job}"
    Path(a.out).mkdir(parents=True, exist_ok=True)
    return main_prefix(a) if a.job == "prefix" else main_kv(a)


if __name__ == "__main__":
    sys.exit(main())
