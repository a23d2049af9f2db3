"""The engine benchmark's arguments: the presets (`real`, `rank`, `tiny`), every flag, their checks, and the config
that is served (the real `SolarOpen2Config` with Nota's compressed-tensors NVFP4 block)."""
from __future__ import annotations
import argparse, re, shlex
from pathlib import Path

from solar_open2 import budget
from solar_open2.config import SolarOpen2Config
from solar_open2.vllm.options import KEY as OPTIONS_KEY, OPTIONS   # the plugin's options table (no vllm import)
from benchmarks.common import INCOMING, out_dir_default

PROG = "python -m benchmarks.engine.perf"
DUMMY_CHOICES = ("realistic-v1", "vllm")     # --dummy-weights: solar_open2.vllm.dummy.DUMMY_WEIGHTS first, vLLM's own last
PHASES = ("eager", "graphs")

PRESETS = {
    "real": dict(tp=2, max_model_len=40960, kv_cache_memory_bytes="16g", max_num_seqs=64,
                 max_num_batched_tokens=16384, decode_contexts=[2048, 32768], decode_tokens=192,
                 prefill_contexts=[8192, 32768], prefill_repeats=2, batch_sizes=[8, 32, 64], batch_prompt=512,
                 batch_tokens=128, capture_sizes=[1, 2, 4, 8, 16, 32, 64], deadline_s=560),
    # one TP2 rank of the real model as a model of its own (budget.rank_config), at TP1 on one GPU: the same kernels,
    # shapes and bytes per token as a rank of `real`, without the all-reduces. For engine A/Bs when one GPU is lent.
    "rank": dict(tp=1, max_model_len=40960, kv_cache_memory_bytes="16g", max_num_seqs=64,
                 max_num_batched_tokens=16384, decode_contexts=[2048, 32768], decode_tokens=192,
                 prefill_contexts=[8192, 32768], prefill_repeats=2, batch_sizes=[8, 32, 64], batch_prompt=512,
                 batch_tokens=128, capture_sizes=[1, 2, 4, 8, 16, 32, 64], deadline_s=560),
    "tiny": dict(tp=1, max_model_len=8192, kv_cache_memory_bytes="2g", max_num_seqs=64,
                 max_num_batched_tokens=8192, decode_contexts=[512, 4096], decode_tokens=128,
                 prefill_contexts=[2048, 4096], prefill_repeats=2, batch_sizes=[8, 32, 64], batch_prompt=256,
                 batch_tokens=64, capture_sizes=[1, 2, 4, 8, 16, 32, 64], deadline_s=480),
}
RANK_OF_TP = 2                   # --config rank: one rank of the real model at this TP
CONFIG_NOTES = {"rank": f"one TP{RANK_OF_TP} rank of the real model (solar_open2.budget.rank_config) served at TP1: "
                        "the per-rank shapes, kernels and bytes, without the all-reduces; not the TP2 figure"}

# --------------------------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------------------------

def _ints(s:str)->list:
    "'2048,32768' -> [2048, 32768] (sizes in vLLM's k/K notation allowed)."
    try: v = [budget.parse_size(x) for x in str(s).split(",") if x.strip()]
    except ValueError as e: raise argparse.ArgumentTypeError(str(e)) from None
    if not v or any(x <= 0 for x in v): raise argparse.ArgumentTypeError(f"{s!r}: expected positive integers, comma-separated")
    return v

KINDS = ("decode", "prefill", "batch", "profile")
# One --x / --no-x flag per option of the plugin's table (solar_open2.vllm.options.OPTIONS), generated from it:
# (flag dest = the option's name, its older per-option key, what it switches). Given flags reach the engine as
# additional_config {"solar_open2": {name: value}}; each is recorded in `settings` under its name (None: the default).
PLUGIN_KEYS = tuple((o.name, o.key, o.what) for o in OPTIONS)

def option_help(o)->str:
    "A generated flag's help: what the option does, its default, what it needs, where it is derived."
    needs = f"; needs {', '.join('--' + r.replace('_', '-') for r in o.requires)}" if o.requires else ""
    return f"{o.what} (plugin option {o.name}, default {'on' if o.default else 'off'}{needs}; chapter {o.chapter})"

def _env_pair(s:str)->tuple:
    k, sep, v = s.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a variable name, got {s!r}")
    return k, v

def _kinds(s:str)->tuple:
    v = tuple(x.strip() for x in s.split(",") if x.strip())
    bad = [x for x in v if x not in KINDS + ("warmup",)]
    if not v or bad: raise argparse.ArgumentTypeError(f"{s!r}: expected a comma-separated subset of {','.join(KINDS)}, or warmup")
    return v

def parse_ab(specs:list)->list:
    "`['name=--flag1 --flag2', ...]` -> `[(name, ['--flag1', '--flag2']), ...]`; raises ValueError naming the bad spec."
    out = []
    for spec in specs or []:
        name, sep, flags = spec.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"--ab {spec!r}: expected NAME=FLAGS with NAME of letters, digits, _ . -")
        fl = shlex.split(flags)
        if any(f.split("=")[0] in ("--phase", "--variant", "--ab") for f in fl):
            raise ValueError(f"--ab {spec!r}: --phase, --variant and --ab are set by the A/B driver")
        out.append((name, fl))
    if len({n for n, _ in out}) != len(out): raise ValueError(f"--ab: variant names must be distinct, got {[n for n, _ in out]}")
    return out

def build_parser()->argparse.ArgumentParser:
    from benchmarks.engine import perf                        # the package docstring is the usage text
    ap = argparse.ArgumentParser(prog=PROG, description=perf.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", choices=PHASES + ("all", "merge", "ab", "ab-merge"), default="all")
    ap.add_argument("--config", choices=tuple(PRESETS), default="real",
                    help="real: SolarOpen2Config.real() at TP2; rank: one TP2 rank of it at TP1 (budget.rank_config: the real "
                         "per-rank shapes on one GPU, no all-reduces); tiny: the tiny preset at TP1 (a cheap dry run)")
    ap.add_argument("--tp", type=int, help="tensor-parallel size (default: 2 real, 1 tiny)")
    ap.add_argument("--max-model-len", type=budget.parse_size)
    ap.add_argument("--kv-cache-memory-bytes", help="KV pool per GPU in vLLM's notation (16g = 16e9, 16G = 16 GiB)")
    ap.add_argument("--max-num-seqs", type=int)
    ap.add_argument("--max-num-batched-tokens", type=budget.parse_size)
    ap.add_argument("--decode-contexts", type=_ints, help="prompt lengths of the single-stream decode runs")
    ap.add_argument("--decode-tokens", type=int, help="greedy tokens generated per single-stream run")
    ap.add_argument("--prefill-contexts", type=_ints)
    ap.add_argument("--prefill-repeats", type=int)
    ap.add_argument("--batch-sizes", type=_ints)
    ap.add_argument("--batch-prompt", type=int, help="prompt tokens of each sequence of the batch runs")
    ap.add_argument("--batch-tokens", type=int, help="tokens generated by each sequence of the batch runs")
    ap.add_argument("--capture-sizes", type=_ints, help="cudagraph_capture_sizes of the graphs phase")
    ap.add_argument("--compile", choices=("vllm", "none"), default="vllm",
                    help="graphs phase: vllm = vLLM's default torch.compile + FULL_AND_PIECEWISE graphs; "
                         "none = no torch.compile, FULL_DECODE_ONLY graphs (faster start)")
    ap.add_argument("--moe-backend", default="auto", help="vLLM --moe-backend (auto: let vLLM choose and record it)")
    ap.add_argument("--dummy-weights", choices=DUMMY_CHOICES, default=DUMMY_CHOICES[0],
                    help=f"{DUMMY_CHOICES[0]}: the plugin's benchmark dummy weights (load format solar_open2_dummy, chapter "
                         "vllm/dummy: real-kind NVFP4 scales, a router that spreads tokens like a trained one); vllm: vLLM's "
                         "plain load_format=dummy (uniform in [-1e-3, 1e-3]; its bias alone routes every token to the same "
                         "experts), for A/Bs against older runs (default: %(default)s)")
    for o in OPTIONS:                                                       # --x / --no-x, from the plugin's options table
        ap.add_argument("--" + o.flag, dest=o.name, action=argparse.BooleanOptionalAction, default=None, help=option_help(o))
    ap.add_argument("--allreduce-fusion", action=argparse.BooleanOptionalAction, default=None,
                    help="graphs phase: vLLM's all-reduce + RMSNorm fusion pass (pass_config fuse_allreduce_rms, needs "
                         "flashinfer.comm) on or off; default: vLLM's default (on for TP > 1 when flashinfer.comm imports)")
    ap.add_argument("--attention-backend", help="vLLM's attention backend for the full-attention layers (attention_config "
                    "backend: FLASH_ATTN, TRITON_ATTN, FLASHINFER, ...); default: vLLM's choice, recorded from its log")
    ap.add_argument("--attn-max-splits", type=int, help="attention_config flash_attn_max_num_splits_for_cuda_graph: the "
                    "most KV splits of FlashAttention's decode under CUDA graphs (vLLM's default 32)")
    ap.add_argument("--compile-sizes", type=_ints, help="graphs phase: vLLM compile_sizes, batch sizes compiled as static "
                    "graphs (with --max-autotune, the sizes inductor autotunes its GEMMs for)")
    ap.add_argument("--max-autotune", action="store_true",
                    help="graphs phase: inductor max_autotune (benchmarks Triton GEMM templates against cuBLAS per shape)")
    ap.add_argument("--draft-head", type=int, metavar="K", help="serve with a random-weight EAGLE-3 head of the published "
                    "Solar draft's shape (five taps, benchmarks.engine.spec) proposing K tokens a step: every draft is "
                    "rejected, so each step verifies 1 + K tokens and yields one, and the decode figures time the verify step")
    ap.add_argument("--draft-vocab", type=int, help="--draft-head: the draft LM head's vocabulary (the target's first N ids, "
                    "vLLM's d2t), to keep the head's own cost small (default 32768, at most the target's)")
    ap.add_argument("--ngram", type=int, metavar="K", help="serve with vLLM's ngram proposer (prompt lookup, n-grams of 2 to 4 "
                    "tokens) proposing up to K tokens a step: the end-to-end speculative figure; each decode figure then "
                    "carries vLLM's counters (acceptance, mean accepted length: tokens a verify step yields)")
    ap.add_argument("--ngram-gpu", action="store_true", help="--ngram with vLLM's GPU proposer (ngram_gpu: matching on the GPU, "
                    "so vLLM keeps asynchronous scheduling, which it turns off for the host proposer)")
    ap.add_argument("--log-stats", action="store_true", help="keep vLLM's per-step stats on (--ngram turns them on to read "
                    "its counters): give it to every variant of an A/B with --ngram, so the baseline pays the same host cost")
    ap.add_argument("--prompt-period", type=int, default=0, metavar="P", help="decode prompts made of one random block of P "
                    "tokens repeated to the context (0: random tokens, the default): context the ngram proposer can match")
    ap.add_argument("--env", type=_env_pair, action="append", metavar="KEY=VALUE",
                    help="an environment variable for the engine (repeat), applied after the harness's own, e.g. "
                         "VLLM_DISABLE_SHARED_EXPERTS_STREAM=1; recorded in the settings")
    ap.add_argument("--variant", help="label of this run: result files are named perf_h200_<phase>_<variant>")
    ap.add_argument("--only", type=_kinds, help=f"comma-separated measurements to run, of {','.join(KINDS)} (default: all); "
                    "'warmup' alone starts the engine, runs the warm-up and stops (fills the JIT and compile caches)")
    ap.add_argument("--ab", action="append", metavar="NAME=FLAGS", help="--phase ab: one variant (repeat; the first is the baseline)")
    ap.add_argument("--profile", action="store_true", help="torch-profile a few decode steps (summary only in the JSON)")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--profile-prefill", action="store_true", help="torch-profile one prefill at each --prefill-contexts: "
                    "time by kernel family against the compute ceiling (prefill_profiles in the JSON; --profile-steps must "
                    "cover the prompt's chunks)")
    ap.add_argument("--keep-trace", action="store_true", help="also copy rank 0's trace (.json.gz, if < 15 MiB) to $OUT")
    ap.add_argument("--smi-interval-ms", type=int, default=500, help="nvidia-smi memory sampling period (peak memory "
                    "per GPU); 0 turns it off (an A/B for host-side stalls in the decode window)")
    ap.add_argument("--smi-during-measure", action="store_true", help="keep the nvidia-smi sampler running through the "
                    "measurements (default: stopped after the warm-up; it stalls decode now and then)")
    ap.add_argument("--smi-ab", action="store_true", help="after the decode figures, stop the nvidia-smi sampler and "
                    "measure the first decode context again (figure_details ..._nosmi)")
    ap.add_argument("--deadline-s", type=float, help="start no measurement after this many seconds (JSON is always written)")
    ap.add_argument("--results-dir", type=Path, default=INCOMING, help="where the JSON files are written and read "
                    "(default benchmarks/results/incoming/: files to index with `python -m benchmarks.index add`)")
    ap.add_argument("--out", type=Path, default=out_dir_default(),
                    help="second output directory (default $OUT): JSON + engine log")
    ap.add_argument("--model-dir", type=Path, help="directory for config.json (default: one fixed temporary path per config, so that vLLM's compile and autotuning caches carry over between runs)")
    ap.add_argument("--no-shim", action="store_true", help="do not write the entry-point shim (plugin pip-installed)")
    return ap

def resolve(a:argparse.Namespace)->argparse.Namespace:
    "Fill preset defaults and validate; raises ValueError naming the flag."
    p = PRESETS[a.config]
    for k, v in p.items():
        if getattr(a, k, None) is None: setattr(a, k, list(v) if isinstance(v, list) else v)
    a.kv_bytes = budget.parse_size(a.kv_cache_memory_bytes)
    cfg = model_config(a.config)
    budget.check_tp(cfg, a.tp)
    if a.config == "rank" and a.tp != 1:
        raise ValueError(f"--config rank is one rank of the real model at TP2, served alone: --tp must be 1, got {a.tp}")
    if a.max_model_len > cfg.max_position_embeddings:
        raise ValueError(f"--max-model-len {a.max_model_len:,} exceeds max_position_embeddings {cfg.max_position_embeddings:,}")
    for flag, ctxs, extra, kind in (("--decode-contexts", a.decode_contexts, a.decode_tokens, "decode"),
                                    ("--prefill-contexts", a.prefill_contexts, 1, "prefill"),
                                    ("--batch-prompt", [a.batch_prompt], a.batch_tokens, "batch")):
        if a.only and kind != "decode" and kind not in a.only: continue     # not measured (the warm-up uses a decode context)
        for c in ctxs:
            if c + extra > a.max_model_len:
                raise ValueError(f"{flag}: {c:,} prompt tokens + {extra} generated exceed --max-model-len {a.max_model_len:,}")
    if max(a.batch_sizes) > a.max_num_seqs:
        raise ValueError(f"--batch-sizes {max(a.batch_sizes)} exceeds --max-num-seqs {a.max_num_seqs}")
    for flag in ("decode_tokens", "batch_tokens", "prefill_repeats", "profile_steps", "max_num_seqs", "batch_prompt"):
        if getattr(a, flag) < 1: raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(a, flag)}")
    if a.attn_max_splits is not None and a.attn_max_splits < 1:
        raise ValueError(f"--attn-max-splits must be >= 1, got {a.attn_max_splits}")
    if a.attention_backend is not None and not re.fullmatch(r"[A-Z0-9_]+", a.attention_backend):
        raise ValueError(f"--attention-backend {a.attention_backend!r}: a name of vLLM's AttentionBackendEnum, e.g. TRITON_ATTN")
    if a.decode_tokens < 3: raise ValueError("--decode-tokens must be >= 3 (the decode rate needs two intervals)")
    if a.draft_head is not None and not 1 <= a.draft_head <= 16: raise ValueError(f"--draft-head must be 1..16 draft tokens, got {a.draft_head}")
    if a.ngram is not None and not 1 <= a.ngram <= 16: raise ValueError(f"--ngram must be 1..16 draft tokens, got {a.ngram}")
    if a.ngram and a.draft_head: raise ValueError("--ngram and --draft-head: one speculative method per engine")
    if a.ngram_gpu and not a.ngram: raise ValueError("--ngram-gpu needs --ngram K (the draft tokens a step)")
    if a.prompt_period < 0: raise ValueError(f"--prompt-period must be >= 0 (0: random prompts), got {a.prompt_period}")
    a.log_stats = a.log_stats or bool(a.ngram)                               # the ngram counters need vLLM's stats
    V = model_config(a.config).vocab_size
    if a.draft_vocab is None: a.draft_vocab = min(32768, V)
    if not 1 <= a.draft_vocab <= V: raise ValueError(f"--draft-vocab {a.draft_vocab}: must be in 1..{V} (the served vocabulary)")
    if a.kv_bytes <= 0: raise ValueError(f"--kv-cache-memory-bytes must be positive, got {a.kv_cache_memory_bytes!r}")
    if a.variant is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", a.variant):
        raise ValueError(f"--variant {a.variant!r}: letters, digits, _ . - only (it names files)")
    a.ab_variants = parse_ab(a.ab)
    if a.phase in ("ab", "ab-merge") and len(a.ab_variants) < 2: raise ValueError(f"--phase {a.phase} needs at least two --ab NAME=FLAGS")
    pl = kv_prediction(a)
    if not pl["fits"]:
        raise ValueError(f"--kv-cache-memory-bytes {a.kv_cache_memory_bytes}: one {a.max_model_len:,}-token request "
                         f"needs {pl['kv_bytes_per_request']:,} B; vLLM would refuse to start")
    return a

def parse_args(argv:list|None=None)->argparse.Namespace:
    "Parse and resolve; exits 2 with a message naming the flag on bad input."
    ap = build_parser()
    a = ap.parse_args(argv)
    try: return resolve(a)
    except ValueError as e: ap.error(str(e))

def stem(config:str)->str: return "perf_h200" if config == "real" else f"perf_h200_{config}"

def run_name(config:str, phase:str, variant:str|None=None)->str: return f"{stem(config)}_{phase}" + (f"_{variant}" if variant else "")


def model_config(name:str)->SolarOpen2Config:
    "The config served, with Nota's compressed-tensors NVFP4 block (experts NVFP4, every other linear BF16)."
    from solar_open2 import nvfp4
    from solar_open2.checkpoint import bf16_linear_modules
    if name not in PRESETS: raise ValueError(f"--config {name!r}: expected one of {tuple(PRESETS)}")
    cfg = SolarOpen2Config.tiny() if name == "tiny" else SolarOpen2Config.real()
    if name == "rank": cfg = budget.rank_config(cfg, RANK_OF_TP)
    cfg.quantization_config = nvfp4.quantization_config("compressed-tensors", bf16_linear_modules(cfg))
    return cfg

def kv_prediction(a)->dict:
    "`solar_open2.budget.plan` for exactly the engine's flags."
    p = budget.plan(tp=a.tp, kv_cache_memory_bytes=a.kv_bytes, max_model_len=a.max_model_len, kv_cache_dtype="auto",
                    block_size=16, prefix_caching=False, max_num_seqs=a.max_num_seqs, cfg=model_config(a.config),
                    num_speculative_tokens=getattr(a, "draft_head", None) or getattr(a, "ngram", None) or 0)
    return {"gpu_kv_cache_tokens": p.gpu_kv_cache_tokens, "max_concurrency": p.max_concurrency,
            "max_concurrency_2dp": round(p.max_concurrency, 2), "num_blocks": p.num_blocks, "block_size": p.block_size,
            "page_bytes": p.layout.page_bytes, "padding_pct": round(p.layout.padding_pct, 2),
            "weights_per_rank_bytes": p.weights_per_rank_bytes, "weights_per_rank_gib": budget.gib(p.weights_per_rank_bytes),
            "kv_bytes_per_request": p.kv_bytes_per_request, "fits": p.fits, "log_lines": p.log_lines,
            "warnings": [w for w in p.warnings if "DGX Spark" not in w]
                        + (["--draft-head: the draft head's own attention layer takes KV pages the prediction does not count"]
                           if getattr(a, "draft_head", None) else [])}

def strip_flags(argv:list, flags:tuple)->list:
    "`argv` without the given value-taking flags (`--flag V` and `--flag=V` forms)."
    out, skip = [], False
    for x in argv:
        if skip: skip = False; continue
        if x in flags: skip = True; continue
        if any(x.startswith(f + "=") for f in flags): continue
        out.append(x)
    return out
