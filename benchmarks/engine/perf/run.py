"""One engine run of the benchmark on the GPU: the model directory and the plugin's registration in every process
vLLM starts, the engine's arguments, token-id prompts stepped by hand, the measurements in priority order under a
deadline, the profile, memory sampling, the engine log; and the drivers that run phases and A/B variants as child
processes."""
from __future__ import annotations
import contextlib, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

from solar_open2.config import SolarOpen2Config
from benchmarks.common import ROOT, child_timeout, run_logged
from benchmarks.engine.perf.cli import CONFIG_NOTES, OPTIONS_KEY, PHASES, PLUGIN_KEYS, model_config, kv_prediction, run_name, strip_flags
from benchmarks.engine.perf.enginelog import compare_kv, parse_engine_log
from benchmarks.engine.perf.figures import (H200_BANDWIDTH, H200_BF16_FLOPS, batch_stats, decode_roofline, gpu_peaks, first_token_sanity, output_sanity,
                                            predicted_step_us, prefill_flops_by_family, prefill_roofline, sanity_passed,
                                            single_stream_stats, spec_roofline, with_roofline)
from benchmarks.engine.perf.results import new_result, out_paths, read_ab_runs, run_merge, versions, write_ab, write_result
from benchmarks.engine.perf.trace import compare_profile, find_traces, load_trace, summarize_trace

MODULE = "benchmarks.engine.perf"                     # what the drivers start as child processes (`python -m`)

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT = "solar_open2 = solar_open2.vllm:register"
DUMMY_ENTRY_POINT = "solar_open2_dummy = solar_open2.vllm.dummy:register_loader"   # the benchmark's load format, in every process
SHIM_DIST = "solar_open2_perf_plugin_shim-0.0.0.dist-info"

# Set in this process before vllm is imported; inherited by every process vLLM starts.
RUN_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "TRITON_CACHE_AUTOTUNING": "1",
           "TRITON_PRINT_AUTOTUNING": "1",
           "VLLM_USE_FLASHINFER_SAMPLER": "0", "TOKENIZERS_PARALLELISM": "false"}
# Forced: NVLink multicast stays off on the lent machines. vLLM's all-reduce fusion auto-selects flashinfer's "mnnvl"
# backend (multicast); with multicast off it initialised and then hit an illegal memory access in the profile run
# (2x H200, 2026-11-30), so the fusion is pinned to the IPC-based "trtllm" backend.
NVLINK_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
              "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm"}

PROFILE_DELAY_STEPS = 3          # worker steps skipped after start_profile (the prefill step and two decodes)

# --------------------------------------------------------------------------------------------------------------
# the model directory and the plugin's registration in every process
# --------------------------------------------------------------------------------------------------------------

def stable_model_dir(name:str)->Path:
    """The default model directory: one fixed path per config. vLLM keys its compile cache on the model path (among
    the config's other fields) and keeps Triton's cache, autotuning results included, inside it; a new temporary
    directory per run made every engine start autotune FLA's chunk-KDA kernels again (about 2 minutes per rank)."""
    return Path(tempfile.gettempdir()) / f"solar_open2_perf_{name}_model"

def model_dir_for(a)->Path:
    "Where a run writes its config.json: `--model-dir`, else the config's fixed path."
    return Path(a.model_dir) if a.model_dir else stable_model_dir(a.config)

def write_model_dir(name:str, path:Path)->Path:
    "Write `config.json` (only that: dummy weights, no tokenizer) into `path`; returns the directory."
    path = Path(path); path.mkdir(parents=True, exist_ok=True)
    if any(p.name != "config.json" for p in path.iterdir()):
        raise FileExistsError(f"{path}: holds files other than config.json; refusing to write a model config there")
    model_config(name).save(path)
    return path

def installed_entry_point(group:str=ENTRY_POINT_GROUP, name:str="solar_open2"):
    "The installed entry point `name` of `group`, or None."
    from importlib.metadata import entry_points
    return next((e for e in entry_points(group=group) if e.name == name), None)

def write_plugin_shim(root:Path, entry_point:str|list=ENTRY_POINT, group:str=ENTRY_POINT_GROUP)->Path:
    "A minimal `*.dist-info` under `root` declaring `entry_point` (one or a list) in `group`; put `root` on sys.path/PYTHONPATH."
    d = Path(root) / SHIM_DIST
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: solar_open2_perf_plugin_shim\nVersion: 0.0.0\n")
    eps = [entry_point] if isinstance(entry_point, str) else list(entry_point)
    (d / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{e}\n" for e in eps))
    return Path(root)

def shim_entry_points(a)->list:
    """The entry points the run's throw-away dist-info declares: the plugin's unless it is installed, and with
    `--dummy-weights realistic-v1` the load format's (`solar_open2.vllm.dummy.register_loader`), which `register()`
    leaves out (it imports no model-loading code)."""
    eps = [] if installed_entry_point() is not None else [ENTRY_POINT]
    if a.dummy_weights != "vllm" and installed_entry_point(name="solar_open2_dummy") is None: eps.append(DUMMY_ENTRY_POINT)
    return eps

def dummy_weights(a)->dict:
    "Which dummy weights a run serves (recorded in the JSON): the name, vLLM's load format, the distribution assumed."
    if a.dummy_weights == "vllm":
        return {"name": "vllm", "load_format": "dummy",
                "distribution": "vLLM's DummyModelLoader: every float parameter uniform in [-1e-3, 1e-3] (FP8 block "
                                "scales and global scales included), packed codes as allocated; the router's bias "
                                "decides the experts (chapter vllm/dummy)"}
    from solar_open2.vllm.dummy import DISTRIBUTION, DUMMY_WEIGHTS, LOAD_FORMAT
    if a.dummy_weights != DUMMY_WEIGHTS: raise ValueError(f"--dummy-weights {a.dummy_weights}: the plugin has {DUMMY_WEIGHTS}")
    return {"name": DUMMY_WEIGHTS, "load_format": LOAD_FORMAT, "distribution": DISTRIBUTION}

def prepend_path(env:dict, *dirs)->str:
    "PYTHONPATH of `env` with `dirs` first (no duplicates); returns the new value."
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    new = [str(d) for d in dirs] + [p for p in old if p not in {str(d) for d in dirs}]
    env["PYTHONPATH"] = os.pathsep.join(new)
    return env["PYTHONPATH"]

def setup_environment(shim_root:Path|None, extra:dict|None=None)->dict:
    "Process-wide environment for the run (`extra`: `--env` settings, applied last); returns what was set (in the JSON)."
    for k, v in RUN_ENV.items(): os.environ.setdefault(k, v)
    os.environ.update(NVLINK_ENV)
    os.environ.update(extra or {})
    dirs = [ROOT] + ([shim_root] if shim_root else [])
    prepend_path(os.environ, *dirs)
    for d in reversed(dirs):
        if str(d) not in sys.path: sys.path.insert(0, str(d))
    for name in ("solar_open2", "solar_open2_dummy"):           # an allow-list of plugins, if set, names ours
        if os.environ.get("VLLM_PLUGINS") and name not in os.environ["VLLM_PLUGINS"].split(","): os.environ["VLLM_PLUGINS"] += "," + name
    import importlib; importlib.invalidate_caches()
    keys = list(RUN_ENV) + list(NVLINK_ENV) + ["PYTHONPATH", "VLLM_PLUGINS", "VLLM_WORKER_MULTIPROC_METHOD",
                                               "CUDA_VISIBLE_DEVICES", "VLLM_ALLREDUCE_USE_SYMM_MEM"] + list(extra or {})
    return {k: os.environ.get(k) for k in keys}

def register_plugin()->str:
    "Call `solar_open2.vllm.register()` in this process; returns where the function came from."
    try: from solar_open2.vllm import register
    except ImportError as e:
        raise RuntimeError(f"solar_open2.vllm.register is not importable ({e}): the plugin branch must be merged "
                           "into the tree that runs this benchmark") from None
    register()
    return f"{register.__module__}.{register.__qualname__}"


# --------------------------------------------------------------------------------------------------------------
# engine arguments, prompts, sampling
# --------------------------------------------------------------------------------------------------------------

def engine_kwargs(a, model_dir, phase:str, profile_dir:str|None=None)->dict:
    "Keyword arguments of `vllm.LLM` for one phase."
    if phase not in PHASES: raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    kw = dict(model=str(model_dir), skip_tokenizer_init=True, load_format=dummy_weights(a)["load_format"], dtype="bfloat16",
              tensor_parallel_size=a.tp, max_model_len=a.max_model_len, kv_cache_memory_bytes=a.kv_bytes,
              max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
              enable_prefix_caching=False, seed=0, disable_log_stats=not getattr(a, "log_stats", False),
              distributed_executor_backend="mp")
    if a.moe_backend != "auto": kw["moe_backend"] = a.moe_backend
    att = {k: v for k, v in (("backend", a.attention_backend), ("flash_attn_max_num_splits_for_cuda_graph", a.attn_max_splits))
           if v is not None}
    if att: kw["attention_config"] = att
    opts = {dest: getattr(a, dest) for dest, _, _ in PLUGIN_KEYS if getattr(a, dest) is not None}
    if opts: kw["additional_config"] = {OPTIONS_KEY: opts}                 # the plugin's one key; unknown names fail at start
    if phase == "eager": kw["enforce_eager"] = True
    else:
        cc = {"cudagraph_capture_sizes": sorted(a.capture_sizes)}
        if a.compile == "none": cc.update(mode=0, cudagraph_mode="FULL_DECODE_ONLY")
        if a.allreduce_fusion is not None: cc["pass_config"] = {"fuse_allreduce_rms": a.allreduce_fusion}
        if a.compile_sizes: cc["compile_sizes"] = sorted(a.compile_sizes)
        if a.max_autotune: cc["inductor_compile_config"] = {"max_autotune": True}
        kw["compilation_config"] = cc
    if a.draft_head: kw["speculative_config"] = draft_head_config(a, model_dir)
    if getattr(a, "ngram", None):
        from benchmarks.engine.spec import ngram_config
        kw["speculative_config"] = ngram_config(a.ngram, "ngram_gpu" if getattr(a, "ngram_gpu", False) else "ngram")   # stats on
                                                                        # (resolve): LLM.get_metrics() counts its drafts
    if profile_dir:
        kw["profiler_config"] = dict(profiler="torch", torch_profiler_dir=str(profile_dir),
                                     torch_profiler_with_stack=False, torch_profiler_use_gzip=True,
                                     torch_profiler_dump_cuda_time_total=False, torch_profiler_record_shapes=False,
                                     ignore_frontend=True,
                                     delay_iterations=PROFILE_DELAY_STEPS, max_iterations=a.profile_steps)
    return kw

def draft_head_config(a, model_dir)->dict:
    """vLLM's speculative_config for `--draft-head K`: the random EAGLE-3 head (`benchmarks.engine.spec.write_eagle3_draft`,
    the published head's five taps scaled to the served layers) written once beside the model's config."""
    from benchmarks.engine.spec import scaled_taps, write_eagle3_draft
    cfg = model_config(a.config)
    d = Path(model_dir) / f"eagle3_draft_v{a.draft_vocab}"
    if not (d / "model.safetensors").exists(): write_eagle3_draft(d, cfg, scaled_taps(cfg.num_hidden_layers), draft_vocab=a.draft_vocab)
    return {"method": "eagle3", "model": str(d), "num_speculative_tokens": a.draft_head}

def token_prompt(n:int, vocab:int, seed:int, period:int=0)->list:
    """`n` token ids, deterministic in `seed`, away from the special ids at both ends of the vocabulary; with `period`
    P > 0, one random block of P ids repeated (and cut) to `n`."""
    import random
    lo, hi = min(1000, vocab // 8), vocab - min(1000, vocab // 8)
    r = random.Random(seed)
    block = [r.randrange(lo, hi) for _ in range(min(period, n) if period > 0 else n)]
    return (block * (n // len(block) + 1))[:n] if block else []

def spec_counters(a, llm)->dict|None:
    "vLLM's speculative-decoding counters (drafts, draft tokens, accepted) of an `--ngram` engine (it logs stats), else None."
    if not getattr(a, "ngram", None): return None
    from benchmarks.engine.spec import spec_metrics
    return spec_metrics(llm)

def periodicity(tokens:list)->int|None:
    "The smallest period P of the second half of `tokens` (it repeats every P ids), None when it has none below half."
    t = tokens[len(tokens) // 2:]
    for p in range(1, len(t) // 2 + 1):
        if all(t[i] == t[i - p] for i in range(p, len(t))): return p
    return None

def sampling_params(max_tokens:int):
    "Greedy, exactly `max_tokens` tokens, no detokenisation, one output per new token (DELTA)."
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                          output_kind=RequestOutputKind.DELTA)

def run_requests(engine, prompts:list, max_tokens:int, tag:str)->list:
    "Add all `prompts` at once and step the engine until done; per request: add time, token arrival times, tokens."
    recs = {}
    params = sampling_params(max_tokens)
    for i, p in enumerate(prompts):
        rid = f"{tag}-{i}"
        recs[rid] = {"prompt_len": len(p), "t_add": time.perf_counter(), "times": [], "tokens": []}
        engine.add_request(rid, {"prompt_token_ids": p}, params)
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            r = recs.get(o.request_id)
            if r is None or not o.outputs: continue
            new = list(o.outputs[0].token_ids)
            r["times"] += [now] * len(new); r["tokens"] += new
    return list(recs.values())


# --------------------------------------------------------------------------------------------------------------
# nvidia-smi memory sampling
# --------------------------------------------------------------------------------------------------------------

SMI_QUERY = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]

def parse_smi(text:str)->dict:
    "Peak and last memory.used (MiB) per GPU index from `nvidia-smi --query-gpu=index,memory.used,memory.total` CSV."
    peak, total, n = {}, {}, {}
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) < 3: continue
        try: i, used, tot = int(parts[0]), float(parts[1]), float(parts[2])
        except ValueError: continue
        peak[i] = max(peak.get(i, 0.0), used); total[i] = tot; n[i] = n.get(i, 0) + 1
    return {"peak_used_mib": {str(i): peak[i] for i in sorted(peak)}, "total_mib": {str(i): total[i] for i in sorted(total)},
            "peak_used_gib": {str(i): round(peak[i] / 1024, 3) for i in sorted(peak)}, "samples": {str(i): n[i] for i in sorted(n)}}

def bw(a)->float:
    "The bandwidth the run's decode ceilings use: its GPU's (set in main from nvidia-smi), the H200's before that."
    return getattr(a, "_bw", H200_BANDWIDTH)

def gpu_info()->dict:
    "Name, memory and driver of each GPU, from nvidia-smi (never initialises CUDA in this process)."
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e: return {"error": str(e)}
    gpus = [dict(zip(("index", "name", "memory_total", "driver"), [x.strip() for x in l.split(",")])) for l in out.splitlines() if l.strip()]
    return {"name": gpus[0]["name"] if gpus else None, "count": len(gpus), "gpus": gpus,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

def stop_smi(p)->bool:
    """Stop the sampler `p` (from `smi_monitor`; None: there is none). The sampler stalls the GPU work now and then:
    on 2026-11-30 one nvidia-smi query cost a decode window a single 317 ms gap (chapter 09), so the measurements run
    without it. Returns whether a sampler was running."""
    if p is None or p.poll() is not None: return False
    p.terminate()
    try: p.wait(timeout=10)
    except subprocess.TimeoutExpired: p.kill(); p.wait()
    return True

def smi_snapshot(path:Path)->None:
    "Append one nvidia-smi memory sample to `path` (after the measurements; no-op without nvidia-smi)."
    if shutil.which("nvidia-smi") is None: return
    with contextlib.suppress(OSError, subprocess.TimeoutExpired), open(path, "a") as f:
        subprocess.run(SMI_QUERY, stdout=f, stderr=subprocess.DEVNULL, timeout=30)

@contextlib.contextmanager
def smi_monitor(path:Path, interval_ms:int=500):
    "Sample GPU memory into `path` while the block runs (a child process of ours, stopped by its pid); 0: no sampling."
    if shutil.which("nvidia-smi") is None or interval_ms <= 0:
        yield None; return
    f = open(path, "w")
    p = subprocess.Popen(SMI_QUERY + ["-lms", str(interval_ms)], stdout=f, stderr=subprocess.DEVNULL)
    try: yield p
    finally:
        stop_smi(p)
        f.close()

# --------------------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------------------
# capturing every process's output (fd level), echoed to the original stdout
# --------------------------------------------------------------------------------------------------------------

class LogCapture:
    "Send fd 1 and 2 of this process, and of every child it starts, through `tee -a path` to the original stdout."
    def __init__(self, path:Path, echo:bool=True):
        self.path, self.echo, self.tee, self.saved = Path(path), echo, None, None

    def __enter__(self):
        sys.stdout.flush(); sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        self.tee = subprocess.Popen(["tee", "-a", str(self.path)], stdin=subprocess.PIPE,
                                    stdout=self.saved[0] if self.echo else subprocess.DEVNULL)
        os.dup2(self.tee.stdin.fileno(), 1); os.dup2(self.tee.stdin.fileno(), 2)
        with contextlib.suppress(AttributeError, ValueError): sys.stdout.reconfigure(line_buffering=True)
        return self

    def text(self)->str:
        "What was captured so far."
        sys.stdout.flush(); sys.stderr.flush(); time.sleep(0.2)
        return self.path.read_text(errors="replace") if self.path.exists() else ""

    def __exit__(self, *exc):
        with contextlib.suppress(Exception): sys.stdout.flush(); sys.stderr.flush()
        os.dup2(self.saved[0], 1); os.dup2(self.saved[1], 2)
        for fd in self.saved: os.close(fd)
        self.tee.stdin.close()
        try: self.tee.wait(timeout=15)           # children still holding the pipe keep tee alive: stop it then
        except subprocess.TimeoutExpired: self.tee.kill(); self.tee.wait()
        return False


# --------------------------------------------------------------------------------------------------------------
# one phase on the GPU
# --------------------------------------------------------------------------------------------------------------

def measure(a, llm, res:dict, save, t0:float, cfg:SolarOpen2Config)->None:
    "Every measurement of one engine, in priority order, saving after each; skip what no longer fits the deadline."
    eng, vocab = llm.llm_engine, cfg.vocab_size
    seed = iter(range(10_000, 1_000_000))
    scale = (0.3 if a.config == "tiny" else 1.0) * (1.0 if a._phase == "eager" else 0.3)   # needs: real eager; tiny, graphs cheaper

    def warmup():                      # one stream at the first decode context, one full batch: new kernel variants
        # graphs: the stream decodes as far as the measurement will (two rank runs had one 0.28-0.39 s gap at the 97th
        # step, where 2,144 tokens open the third 1,072-token KV block); eager: 16 tokens (6 tok/s)
        n = 16 if a._phase == "eager" else a.decode_tokens
        run_requests(eng, [token_prompt(a.decode_contexts[0], vocab, next(seed))], n, "warm-1")
        run_requests(eng, [token_prompt(64, vocab, next(seed)) for _ in range(max(a.batch_sizes))], 8, "warm-b")
        if not (a.smi_during_measure or a.smi_ab): res["smi_stopped_after_warmup"] = stop_smi(getattr(a, "_smi", None))

    def decode(ctx):
        c0 = spec_counters(a, llm)
        rec = run_requests(eng, [token_prompt(ctx, vocab, next(seed), a.prompt_period)], a.decode_tokens, f"dec{ctx}")
        st = single_stream_stats(rec[0]); res["sanity"][f"decode_bs1_ctx{ctx}"] = output_sanity(rec)
        st["period"] = periodicity(rec[0]["tokens"])              # what the proposer could match in the continuation
        if c0 is not None:
            from benchmarks.engine.spec import delta
            st["spec"] = delta(c0, spec_counters(a, llm))
        roof = decode_roofline(cfg, a.tp, ctx + a.decode_tokens / 2, 1, bw(a))
        res["figures"][f"decode_bs1_ctx{ctx}"] = with_roofline(
            {"kind": "decode", "context": ctx, "batch": 1, "tokens": st["tokens"], "itl_median_ms": st.get("itl_median_ms"),
             "decode_tok_s": st["decode_tok_s"], "tokens_per_step": st.get("tokens_per_step"),
             **({"acceptance": st["spec"]["acceptance"], "mean_accepted_length": st["spec"]["mean_accepted_length"]}
                if "spec" in st else {})}, roof, "decode_tok_s", "per_seq_tok_s", "decode-bandwidth")
        k = getattr(a, "ngram", None) or getattr(a, "draft_head", None)
        if k:                                       # the verify's own ceiling: 1 + k tokens a step, MAL of them kept
            f = res["figures"][f"decode_bs1_ctx{ctx}"]
            f["spec_roofline"] = sr = spec_roofline(cfg, a.tp, ctx + a.decode_tokens / 2, k, f.get("mean_accepted_length"), bw(a))
            f["fraction_of_spec_roofline"] = st["decode_tok_s"] / sr["per_seq_tok_s"] if sr["per_seq_tok_s"] else None
        smi = getattr(a, "_smi", None)
        res["figure_details"][f"decode_bs1_ctx{ctx}"] = {**st, "smi_running": smi is not None and smi.poll() is None}

    def decode_nosmi(ctx):             # the A/B for host-side stalls: stop the nvidia-smi sampler, measure the same again
        stopped = stop_smi(getattr(a, "_smi", None))
        rec = run_requests(eng, [token_prompt(ctx, vocab, next(seed))], a.decode_tokens, f"dec{ctx}-nosmi")
        res["figure_details"][f"decode_bs1_ctx{ctx}_nosmi"] = {**single_stream_stats(rec[0]), "smi_stopped": stopped}

    def prefill(ctx):                  # time to first token with max_tokens=1, best of the repeats (other prompts)
        recs = [run_requests(eng, [token_prompt(ctx, vocab, next(seed))], 1, f"pre{ctx}-{i}")[0] for i in range(a.prefill_repeats)]
        runs = [single_stream_stats(r) for r in recs]
        res["sanity"][f"prefill_ctx{ctx}"] = first_token_sanity(recs)
        best = max(runs, key=lambda r: r["prefill_tok_s"])
        fig = with_roofline({"kind": "prefill", "context": ctx, "batch": 1, "ttft_s": best["ttft_s"],
                             "prefill_tok_s": best["prefill_tok_s"], "chunk_tokens": a.max_num_batched_tokens,
                             "runs_tok_s": [r["prefill_tok_s"] for r in runs]},
                            prefill_roofline(cfg, a.tp, ctx), "prefill_tok_s", "tok_s", "prefill-compute")
        fig["decode_roofline_tok_s"] = decode_roofline(cfg, a.tp, ctx, 1, bw(a))["per_seq_tok_s"]
        res["figures"][f"prefill_ctx{ctx}"] = fig

    def batch(b):
        recs = run_requests(eng, [token_prompt(a.batch_prompt, vocab, next(seed)) for _ in range(b)], a.batch_tokens, f"bat{b}")
        st = batch_stats(recs); res["sanity"][f"decode_bs{b}"] = output_sanity(recs)
        roof = decode_roofline(cfg, a.tp, a.batch_prompt + a.batch_tokens / 2, b, bw(a))
        res["figures"][f"decode_bs{b}"] = with_roofline(
            {"kind": "batch", "context": a.batch_prompt, "batch": b, "decode_tok_s": st["decode_tok_s"],
             "per_seq_tok_s": st["per_seq_tok_s"], "window": st["window"]},
            roof, "decode_tok_s", "aggregate_tok_s", "decode-bandwidth")
        res["figure_details"][f"decode_bs{b}"] = st

    def profile():
        res["profile"] = run_profile(a, llm, cfg, vocab, next(seed))

    def profile_prefill(ctx):
        res.setdefault("prefill_profiles", {})[str(ctx)] = run_prefill_profile(a, llm, cfg, vocab, next(seed), ctx)

    plan = [("warmup", 60, warmup, ())]
    plan += [(f"decode_bs1_ctx{c}", 60 if c > 8192 else 40, decode, (c,)) for c in a.decode_contexts]
    plan += [(f"decode_bs1_ctx{a.decode_contexts[0]}_nosmi", 40, decode_nosmi, (a.decode_contexts[0],))] if a.smi_ab else []
    plan += [(f"prefill_ctx{c}", (20 + 10 * a.prefill_repeats) * (c / 32768 + 0.5), prefill, (c,)) for c in a.prefill_contexts]
    plan += [(f"decode_bs{b}", 45, batch, (b,)) for b in a.batch_sizes]
    plan += [("profile", 90, profile, ())] if a.profile else []
    plan += [(f"profile_prefill_ctx{c}", 60 * (c / 32768 + 1), profile_prefill, (c,)) for c in a.prefill_contexts] if a.profile_prefill else []
    kind = lambda label: "profile" if label.startswith("profile") else "decode" if label.startswith("decode_bs1_") else \
        "prefill" if label.startswith("prefill") else "batch" if label.startswith("decode_bs") else "warmup"
    if a.only: plan = [x for x in plan if kind(x[0]) in a.only + ("warmup",)]
    for label, need, fn, args in plan:
        need *= scale
        left = a.deadline_s - (time.perf_counter() - t0)
        if left < need:
            res["skipped"].append({"what": label, "left_s": round(left, 1), "needed_s": round(need, 1)}); save(); continue
        t = time.perf_counter()
        try: fn(*args)
        except Exception as e:                                       # record, and go on unless the engine is gone
            res["errors"].append({"what": label, "error": f"{type(e).__name__}: {str(e)[:1000]}"})
            if "EngineDead" in type(e).__name__ or "dead" in str(e).lower(): save(); raise
        res["timeline"].append({"what": label, "at_s": round(t - t0, 1), "took_s": round(time.perf_counter() - t, 1)})
        save()

def run_profile(a, llm, cfg:SolarOpen2Config, vocab:int, seed:int)->dict:
    "Profile `--profile-steps` decode steps of one stream at the first decode context; summary of rank 0's trace."
    d = Path(a._profile_dir)
    ctx = a.decode_contexts[0]
    t = time.perf_counter(); since = time.time() - 1
    llm.start_profile()
    run_requests(llm.llm_engine, [token_prompt(ctx, vocab, seed)], PROFILE_DELAY_STEPS + a.profile_steps + 8, "prof")
    llm.stop_profile()
    traces = new_traces(d, since, a.tp)
    if not traces: return {"error": f"no trace files in {d}", "seconds": time.perf_counter() - t}
    trace = load_trace(traces[0])
    s = summarize_trace(trace)                                       # steps counted from vLLM's step annotations
    if not s["steps"]: s = summarize_trace(trace, steps=a.profile_steps) | {"steps_source": "requested"}
    s["steps_requested"] = a.profile_steps
    s.update(trace_file=traces[0].name, trace_bytes=traces[0].stat().st_size, context=ctx, batch=1,
             seconds=round(time.perf_counter() - t, 1))
    pred = predicted_step_us(cfg, a.tp, ctx, bandwidth=bw(a))
    s["predicted_us_per_step"] = {k: round(v, 1) for k, v in pred.items()}
    s["vs_prediction"] = compare_profile(s, pred)
    keep_trace(a, traces[0])
    return s

def keep_trace(a, trace:Path, label:str="")->None:
    "With --keep-trace and --out: copy rank 0's trace there as <run>_<label>trace_rank0.json.gz (if under 15 MiB)."
    if a.keep_trace and a.out and trace.stat().st_size < 15 * 2**20:
        shutil.copy(trace, Path(a.out) / f"{run_name(a.config, a._phase, a.variant)}_{label}trace_rank0{''.join(trace.suffixes[-2:])}")

def new_traces(d:Path, since:float, n:int, wait_s:int=60)->list:
    "The trace files in `d` written after `since` (rank 0 first), waiting up to `wait_s` for `n` of them (rank 1 may still be writing)."
    fresh = []
    for _ in range(wait_s):
        fresh = [f for f in find_traces(d) if f.stat().st_mtime >= since] if d.exists() else []
        if len(fresh) >= n: break
        time.sleep(1)
    return fresh

def prefill_profile_summary(s:dict, cfg:SolarOpen2Config, tp:int, ctx:int, chunk:int, peak:float=H200_BF16_FLOPS)->dict:
    """A prefill trace's summary (`summarize_trace`) against the compute ceiling, per kernel family: each family's FLOPs
    for `ctx` prompt tokens (`prefill_flops_by_family`), the time they need at `peak`, and the fraction of the kernels'
    time that is (`fraction_of_ceiling`); the whole prefill's likewise over the GPU's busy time."""
    flops = {k: v * ctx for k, v in prefill_flops_by_family(cfg, tp, ctx).items()}
    chunks = -(-ctx // chunk)
    fams = []
    for f in s["families"]:
        need = 1e6 * flops.get(f["family"], 0.0) / peak
        fams.append({**f, "flops": flops.get(f["family"], 0.0), "ceiling_us": round(need, 1),
                     "fraction_of_ceiling": round(need / f["us"], 4) if f["us"] and need else None})
    need = 1e6 * sum(flops.values()) / peak
    return {**s, "families": fams, "context": ctx, "chunks_expected": chunks, "flops": sum(flops.values()),
            "ceiling_us": round(need, 1), "fraction_of_ceiling": round(need / s["gpu_busy_us"], 4) if s["gpu_busy_us"] else None,
            "complete": s["steps"] is not None and s["steps"] >= chunks}

def run_prefill_profile(a, llm, cfg:SolarOpen2Config, vocab:int, seed:int, ctx:int)->dict:
    """Profile one prefill of `ctx` tokens (max_tokens=1): where its time goes by kernel family against the compute
    ceiling (`prefill_profile_summary`). The engine's profiler skips its first `PROFILE_DELAY_STEPS` worker steps (set
    for the decode profile), so a short request of exactly that many steps runs first; `complete` says whether the
    trace holds every chunk of the prompt (`--profile-steps` must be at least the chunks)."""
    d = Path(a._profile_dir)
    t = time.perf_counter(); since = time.time() - 1
    llm.start_profile()
    run_requests(llm.llm_engine, [token_prompt(8, vocab, seed)], PROFILE_DELAY_STEPS, "pfw")   # one prefill, two decodes
    run_requests(llm.llm_engine, [token_prompt(ctx, vocab, seed + 1)], 1, f"pfp{ctx}")
    llm.stop_profile()
    traces = new_traces(d, since, a.tp)
    if not traces: return {"error": f"no new trace files in {d}", "context": ctx, "seconds": round(time.perf_counter() - t, 1)}
    s = prefill_profile_summary(summarize_trace(load_trace(traces[0])), cfg, a.tp, ctx, a.max_num_batched_tokens)
    s.update(trace_file=traces[0].name, trace_bytes=traces[0].stat().st_size, seconds=round(time.perf_counter() - t, 1))
    keep_trace(a, traces[0], f"prefill{ctx}_")
    return s

def run_phase(a, phase:str, argv:list)->int:
    "One engine, every measurement, one JSON. Returns the exit code."
    t0 = time.perf_counter()
    a._phase = phase
    import signal                                                    # a time limit's SIGTERM still shuts the engine down
    prev_sigterm = None
    with contextlib.suppress(ValueError): prev_sigterm = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    name = run_name(a.config, phase, a.variant)
    res = new_result(a, phase, argv)
    paths = out_paths(a, name + ".json")
    save = lambda: write_result(res, paths)
    work = Path(tempfile.mkdtemp(prefix=f"solar_open2_{name}_"))
    log_path = (Path(a.out) if a.out else work) / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists(): log_path.unlink()
    shim = None
    if not a.no_shim and shim_entry_points(a): shim = write_plugin_shim(work / "plugin_shim", shim_entry_points(a))
    res["env"] = setup_environment(shim, dict(a.env or []))
    res["gpu"] = gpu_info()
    bw_, _, key = gpu_peaks(res["gpu"].get("name"))
    a._bw = bw_                                                     # every ceiling below is the GPU's this ran on
    res["kv_pool"] = {"predicted": kv_prediction(a)}
    cfg = model_config(a.config)
    res["roofline"] = {"gpu": key or "h200 (not in the table: its figures)", "bandwidth_Bps": bw_,
                       "decode": {str(c): decode_roofline(cfg, a.tp, c + a.decode_tokens / 2, 1, bw_) for c in a.decode_contexts},
                       "batch": {str(b): decode_roofline(cfg, a.tp, a.batch_prompt + a.batch_tokens / 2, b, bw_) for b in a.batch_sizes},
                       "prefill": {str(c): prefill_roofline(cfg, a.tp, c) for c in a.prefill_contexts},
                       "predicted_step_us": {str(c): predicted_step_us(cfg, a.tp, c, bandwidth=bw_) for c in a.decode_contexts}}
    save()
    rc, llm = 0, None
    with LogCapture(log_path) as cap, smi_monitor(work / "smi.csv", a.smi_interval_ms) as smi:
        a._smi = smi
        try:
            res["plugin"] = {"register": register_plugin(), "shim": str(shim) if shim else None,
                             "entry_point_seen": str(installed_entry_point())}
            if a.dummy_weights != "vllm":                             # this process too (an in-process engine core)
                from solar_open2.vllm.dummy import register_loader
                register_loader()
            print(f"[perf_h200] {name}: dummy weights {res['dummy_weights']['name']} (load_format="
                  f"{res['dummy_weights']['load_format']})", flush=True)
            res["versions"] = versions()
            from vllm import LLM
            model_dir = write_model_dir(a.config, model_dir_for(a))
            a._profile_dir = str(work / "profile") if a.profile or a.profile_prefill else None
            kw = engine_kwargs(a, model_dir, phase, a._profile_dir)
            res["engine"] = {"kwargs": {k: v for k, v in kw.items() if k != "model"}}
            print(f"[perf_h200] {name}: starting the engine", flush=True)
            t = time.perf_counter()
            llm = LLM(**kw)
            res["engine"]["init_s"] = round(time.perf_counter() - t, 1)
            res["timeline"].append({"what": "engine ready", "at_s": round(time.perf_counter() - t0, 1)})
            res["engine"]["log"] = parse_engine_log(cap.text())
            res["kv_pool"]["logged"] = {k: res["engine"]["log"][k] for k in ("kv_cache_tokens", "max_concurrency", "block_size")}
            res["kv_pool"]["comparison"] = compare_kv(res["kv_pool"]["predicted"], res["engine"]["log"])
            res["status"] = "running"; save()
            measure(a, llm, res, save, t0, cfg)
            res["status"] = "complete" if not (res["skipped"] or res["errors"]) else "partial"
        except BaseException as e:                                   # noqa: BLE001 - the JSON must say what happened
            import traceback
            res["status"], res["error"] = "failed", f"{type(e).__name__}: {str(e)[:2000]}"
            res["traceback"] = traceback.format_exc()[-4000:]
            rc = 1
        finally:
            res["engine"] = res["engine"] or {}
            res["engine"]["log_final"] = parse_engine_log(cap.text())
            if llm is not None:
                with contextlib.suppress(Exception): llm.llm_engine.engine_core.shutdown(timeout=60)
            del llm
            import multiprocessing
            for p in multiprocessing.active_children():              # our own engine processes only, by pid
                with contextlib.suppress(Exception): p.terminate(); p.join(10)
    smi_snapshot(work / "smi.csv")
    sampled = "the whole phase" if a.smi_during_measure or a.smi_ab else "the engine start and warm-up, plus one sample at the end"
    res["memory"] = {"source": f"nvidia-smi memory.used sampled every {a.smi_interval_ms / 1e3:g} s over {sampled}",
                     **parse_smi((work / "smi.csv").read_text() if (work / "smi.csv").exists() else "")}
    lf = res["engine"].get("log_final", {})
    res["memory"]["model_loading_gib"] = [m["gib"] for m in lf.get("model_loading", [])]
    res["memory"]["graph_capture_gib"] = lf.get("graph_capture_gib")
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    save()
    print(f"[perf_h200] {name}: {res['status']}; wrote {', '.join(map(str, paths))}; log {log_path}", flush=True)
    print(summary_text(res), flush=True)
    shutil.rmtree(work / "profile", ignore_errors=True)
    if prev_sigterm is not None: signal.signal(signal.SIGTERM, prev_sigterm)
    return rc

def summary_text(res:dict)->str:
    "A few lines for the console."
    lines = [f"{res.get('phase')} [{res.get('status')}] {res.get('error') or ''}".rstrip(),
             f"  dummy weights: {(res.get('dummy_weights') or {}).get('name', 'not recorded')}"
             + (f" ({res['engine']['log_final']['dummy_weights']})" if ((res.get('engine') or {}).get('log_final') or {}).get('dummy_weights') else "")]
    for k, f in res.get("figures", {}).items():
        ok = sanity_passed((res.get("sanity") or {}).get(k))
        lines.append(f"  {k:22s} {f['value_tok_s']:10.1f} tok/s  = {100 * f['fraction_of_roofline']:5.1f}% of "
                     f"{f['roofline_kind']} roofline {f['roofline_tok_s']:.1f}"
                     + ("" if ok else "  [GATED OUT: output-diversity check " + ("failed]" if ok is False else "unchecked]")))
    c = (res.get("kv_pool") or {}).get("comparison")
    if c: lines.append(f"  KV pool: logged {c['logged_tokens']} tokens / {c['logged_concurrency']}x, predicted "
                       f"{c['predicted_tokens']} / {c['predicted_concurrency']}x -> match={c['match']}")
    lf = (res.get("engine") or {}).get("log_final") or {}
    if lf: lines.append(f"  NvFp4 MoE backend: {lf.get('nvfp4_moe_backend')}; attention: {lf.get('attention_backends')}; "
                        f"all-reduce fusion left out: {'; '.join(lf.get('allreduce_fusion_off') or []) or 'no'}")
    at = lf.get("autotune") or {}
    if at.get("runs"): lines.append(f"  engine start: init {lf.get('init_engine_s')} s (compile {lf.get('compilation_s')} s); "
                                    f"Triton autotuning {at['runs']} keys, {at['seconds']} s over all processes, most: "
                                    + ", ".join(f"{k} {v['seconds']} s" for k, v in list(at["by_function"].items())[:3]))
    p = res.get("profile")
    if p and p.get("families"):
        lines.append("  profile (us/step): " + ", ".join(f"{r['family']} {r['us_per_step']}" for r in p["families"][:6]))
    for s in res.get("skipped", []): lines.append(f"  skipped {s['what']} ({s['left_s']} s left, {s['needed_s']} needed)")
    return "\n".join(lines)


def child_env()->dict:
    "This process's environment with the repository first on PYTHONPATH, so that `python -m benchmarks...` imports."
    env = dict(os.environ); prepend_path(env, ROOT)
    return env

# Kept for each later A/B variant: a warm engine start + the measurements, by config. real: 225-237 s to a ready
# engine on 2x H200 (TP2); rank: 66-74 s to ready, 76-85 s in all with --only decode (one H200, 2026-12-01: variants
# a0b, a1-a3); tiny: a guess of the same kind. With rank at 270 the first of three variants in 500 s got 167 s, and a
# cold first engine (200 s to ready) measured nothing.
AB_RESERVE_S = {"real": 270, "rank": 100, "tiny": 60}
# A variant's deadline stops it starting measurements, not a hung engine (on 2026-12-07 an EAGLE-3 engine with full
# graphs sat at 96 % CPU for minutes): past its share plus this it is killed with stack dumps and the next one starts.
AB_GRACE_S = 150

def run_ab(a, argv:list)->int:
    """Every `--ab` variant as a graphs-phase child process, one after the other, its output in `ab_NAME.log` beside the
    results (`run_logged`: killed with stack dumps `AB_GRACE_S` past its share of the deadline); then
    `perf_h200[_CONFIG]_ab.json`."""
    t0, rc = time.perf_counter(), 0
    rest = strip_flags(argv, ("--phase", "--deadline-s", "--ab", "--variant"))
    for i, (name, flags) in enumerate(a.ab_variants):
        left = a.deadline_s - (time.perf_counter() - t0)
        share = max(left / (len(a.ab_variants) - i), left - AB_RESERVE_S[a.config] * (len(a.ab_variants) - i - 1))   # the first pays the cold start
        cmd = [sys.executable, "-m", MODULE, "--phase", "graphs", "--variant", name, "--deadline-s", f"{share:.0f}", *flags, *rest]
        print(f"[perf_h200] ab: {' '.join(cmd)}", flush=True)
        log = Path(a.out or a.results_dir) / f"ab_{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        limit = child_timeout(share, 0.0, AB_GRACE_S)                     # its share of the deadline, then the grace
        code = run_logged(cmd, log, limit, env=child_env(), cwd=ROOT)
        print("".join(log.read_text(errors="replace").splitlines(keepends=True)[-12:]), end="", flush=True)
        if code == 124: print(f"[perf_h200] ab: {name} still running {limit:.0f} s after its start: killed "
                              f"(stacks in {log}); the next variant starts", flush=True)
        rc = max(rc, code)
    return max(rc, write_ab(a, argv, read_ab_runs(a)))


def run_all(a, argv:list)->int:
    "Both phases as child processes (each frees its GPUs on exit), then the merge."
    t0, rc = time.perf_counter(), 0
    rest = strip_flags(argv, ("--phase", "--deadline-s"))
    for i, ph in enumerate(PHASES):
        left = a.deadline_s - (time.perf_counter() - t0)
        share = left * (0.55 if i == 0 else 1.0)
        cmd = [sys.executable, "-m", MODULE, "--phase", ph, "--deadline-s", f"{share:.0f}", *rest]
        print(f"[perf_h200] all: {' '.join(cmd)}", flush=True)
        rc = max(rc, subprocess.run(cmd, cwd=ROOT, env=child_env()).returncode)
    return max(rc, run_merge(a))
