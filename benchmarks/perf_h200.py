#!/usr/bin/env python
"""Full-size Solar-Open2 on H200 through the vLLM plugin: decode, prefill, CUDA graphs vs eager, KV pool, profile.

    python benchmarks/perf_h200.py --phase eager  [--profile]   # one engine, enforce_eager=True
    python benchmarks/perf_h200.py --phase graphs [--profile]   # one engine, torch.compile + CUDA graphs
    python benchmarks/perf_h200.py --phase merge                # CPU only: eager + graphs JSON -> perf_h200.json
    python benchmarks/perf_h200.py --phase all [--profile]      # eager, graphs (child processes), merge
    python benchmarks/perf_h200.py --phase ab --ab separate=--no-fuse-kda-proj --ab fused=--fuse-kda-proj \
        --only decode,profile --profile                           # graphs-phase variants back to back, one job
    python benchmarks/perf_h200.py --phase ab-merge --ab separate= --ab fused=   # CPU: the A/B summary from their JSON
    python benchmarks/perf_h200.py --config tiny --phase all    # dry run of the whole harness on one GPU (TP1)
    python benchmarks/perf_h200.py log --change TEXT --figure NAME --predicted X [--measured Y | --results FILE]

The engine serves the REAL `SolarOpen2Config.real()` written as `config.json` with the compressed-tensors NVFP4
`quantization_config` block of Nota's checkpoint (`solar_open2.nvfp4.quantization_config` over the ignore list
`solar_open2.checkpoint.bf16_linear_modules`), `load_format="dummy"` (random weights of the real shapes, so the real
kernels and bytes), `skip_tokenizer_init=True` (token-id prompts), TP2, prefix caching off, an explicit
`kv_cache_memory_bytes` so that `solar_open2.budget.plan` predicts the KV pool exactly.

One phase = one engine = one process. Measured in order (each figure is written to the JSON as soon as it exists,
and no measurement starts after `--deadline-s`): warm-up; single-stream decode at each `--decode-contexts`
(prompt of that many tokens, then `--decode-tokens` greedy tokens; the first token's latency also gives a prefill
figure); prefill at each `--prefill-contexts` (max_tokens=1, repeated, best kept); batch decode at each
`--batch-sizes` (that many `--batch-prompt`-token prompts at once, `--batch-tokens` each, throughput over the window
in which all of them decode); with `--profile` the torch profiler (vLLM's `profiler_config`) over a few decode
steps, summarised by kernel family. Every figure carries its fraction of the H200 decode roofline of
`solar_open2.budget.decode_ceiling` (4.8 TB/s, same TP, same context and batch); prefill figures also carry a
compute ceiling (989 TFLOP/s dense BF16).

From the engine log (captured at the file-descriptor level, so the engine-core and worker processes are included):
the KV pool vLLM reports ("GPU KV cache size: N tokens", "Maximum concurrency ...") against the budget's
prediction, the NvFp4 MoE backend vLLM selected, the attention backend, hybrid block size, model-loading memory,
init / compile / graph-capture times. Peak memory per GPU from `nvidia-smi`, sampled every 0.5 s through the engine
start and warm-up, plus one sample at the end. The sampler is stopped before the measurements: it stalled one
decode window by 317 ms.

Outputs: `benchmarks/results/perf_h200_<phase>.json` and, when `$OUT` is set, `$OUT/perf_h200_<phase>.json` plus
the engine log `$OUT/perf_h200_<phase>.log` (the tiny dry run writes `perf_h200_tiny_*`; `--variant V` appends `_V`).

A/B (`--phase ab`): each `--ab NAME=FLAGS` runs as its own graphs-phase child process (`--variant NAME` plus FLAGS
plus every other flag given), one after the other in the same job, on the same machine, with the same settings;
then `perf_h200_ab.json` holds each variant's figures and profile families and every figure's ratio to the first
variant. `--only` limits the measurements (warm-up always runs) to save engine time. The A/B gives each later
variant `AB_RESERVE_S[config]`, which assumes warm caches: on a fresh machine the first engine spent 466 s before it was ready
(3 min in flashinfer's all-reduce JIT, 150 s in vLLM's profiling/warm-up; 2026-11-30), past its allotment, and the
whole call measured nothing. Warm the caches in an earlier call with the same flags and `--only warmup`.

The plugin: the script calls `solar_open2.vllm.register()` itself, and, unless a `solar_open2` entry point is
already installed, writes a throw-away `*.dist-info` holding the `vllm.general_plugins` entry point
`solar_open2 = solar_open2.vllm:register` into a temporary directory that it puts (with the repository root) on
PYTHONPATH, so that every process vLLM starts (forked or spawned engine core, workers, the registry's inspection
subprocess) finds it through `load_general_plugins()`. No pip install is needed.
"""
from __future__ import annotations
import argparse, contextlib, datetime, gzip, json, os, platform, re, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path: sys.path.insert(0, str(ROOT / "benchmarks"))

from solar_open2 import budget                       # noqa: E402  (CPU-only imports; vllm is imported lazily)
from solar_open2.config import SolarOpen2Config      # noqa: E402
from solar_open2.vllm.options import BY_NAME as _OPTIONS    # noqa: E402  (the plugin's options table; no vllm import)
FUSE_KDA_PROJ, GEMV_FLAT, GEMV_KERNEL, GEMV_PAIRS, KDA_DECODE_GATES, KDA_DECODE_KERNEL, KDA_GATE_KERNEL, MOE_DIRECT_OUT, MOE_PAIRS, ROUTER_KERNEL = (
    _OPTIONS[n].key for n in ("fuse_kda_proj", "gemv_flat", "gemv_kernel", "gemv_pairs", "kda_decode_gates", "kda_decode_kernel",
                              "kda_gate_kernel", "moe_direct_out", "moe_pairs", "router_kernel"))   # the older per-option keys, still read
from kernel_bench import git_commit, git_dirty, source_digest   # noqa: E402  (what the benchmark scripts share)

SCHEMA = 1
PHASES = ("eager", "graphs")
RESULTS = ROOT / "benchmarks" / "results"
H200_BANDWIDTH = budget.BANDWIDTH["h200"]            # 4.8e12 B/s per GPU
H200_BF16_FLOPS = 989.4e12                           # dense BF16 tensor-core peak, H200 SXM
ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT = "solar_open2 = solar_open2.vllm:register"
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
PROFILE_DELAY_STEPS = 3          # worker steps skipped after start_profile (the prefill step and two decodes)

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
# (flag dest, the plugin's additional_config key, what it switches): one --x / --no-x flag each, recorded in `settings`
PLUGIN_KEYS = (
    ("fuse_kda_proj", FUSE_KDA_PROJ, "the plugin's fused KDA projections"),
    ("kda_gate_kernel", KDA_GATE_KERNEL, "the KDA low-rank gates of decode batches through chapter 08h's kernels (on since 2026-11-30)"),
    ("gemv_kernel", GEMV_KERNEL, "small-batch dense projections, router and LM head through chapter 08i's kernels (on since 2026-11-30)"),
    ("kda_decode_kernel", KDA_DECODE_KERNEL, "KDA decode steps (conv, gate, delta rule, o_norm) through chapter 08j's one kernel (on since 2026-11-30)"),
    ("router_kernel", ROUTER_KERNEL, "MoE routing of decode batches (logits, top-8, weights) through chapter 08k's one kernel (on)"),
    ("moe_pairs", MOE_PAIRS, "08k's routing kernel writes the activation pairs 08f's half2 gate/up loads, with --moe-backend emulation (on since 2026-12-01)"),
    ("gemv_pairs", GEMV_PAIRS, "two projections of one input in one launch where chapter 08i's PAIR_TILES says so: the attention layers' qkv_proj + g_proj (on since 2026-12-01)"),
    ("gemv_flat", GEMV_FLAT, "08h's flat one-token GEMV body (08i's kind fma1) for the shapes chapter 08i's table gives it: o_proj (on since 2026-12-01; --no-gemv-flat: the 3-D plan)"),
    ("moe_direct_out", MOE_DIRECT_OUT, "with --moe-backend emulation, 08g's decode kernels write the MoE layer's output in vLLM's finalize step, no workspace copy (on since 2026-12-01; --no-moe-direct-out: the copy)"),
    ("kda_decode_gates", KDA_DECODE_GATES, "KDA decode steps in three launches: qkvb_proj + fg_a_proj in one GEMV (08i), the gates' up-projections and beta in 08j's kernel (on since 2026-12-01)"),
)

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
    import shlex
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
    ap = argparse.ArgumentParser(prog="perf_h200.py", description=__doc__.splitlines()[0],
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
    for dest, key, what in PLUGIN_KEYS:                                     # --x / --no-x: additional_config key, else the plugin's default
        ap.add_argument("--" + dest.replace("_", "-"), action=argparse.BooleanOptionalAction, default=None,
                        help=f"{what} (additional_config {key}); default: the plugin's default")
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
    ap.add_argument("--env", type=_env_pair, action="append", metavar="KEY=VALUE",
                    help="an environment variable for the engine (repeat), applied after the harness's own, e.g. "
                         "VLLM_DISABLE_SHARED_EXPERTS_STREAM=1; recorded in the settings")
    ap.add_argument("--variant", help="label of this run: result files are named perf_h200_<phase>_<variant>")
    ap.add_argument("--only", type=_kinds, help=f"comma-separated measurements to run, of {','.join(KINDS)} (default: all); "
                    "'warmup' alone starts the engine, runs the warm-up and stops (fills the JIT and compile caches)")
    ap.add_argument("--ab", action="append", metavar="NAME=FLAGS", help="--phase ab: one variant (repeat; the first is the baseline)")
    ap.add_argument("--profile", action="store_true", help="torch-profile a few decode steps (summary only in the JSON)")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--keep-trace", action="store_true", help="also copy rank 0's trace (.json.gz, if < 15 MiB) to $OUT")
    ap.add_argument("--smi-interval-ms", type=int, default=500, help="nvidia-smi memory sampling period (peak memory "
                    "per GPU); 0 turns it off (an A/B for host-side stalls in the decode window)")
    ap.add_argument("--smi-during-measure", action="store_true", help="keep the nvidia-smi sampler running through the "
                    "measurements (default: stopped after the warm-up; it stalls decode now and then)")
    ap.add_argument("--smi-ab", action="store_true", help="after the decode figures, stop the nvidia-smi sampler and "
                    "measure the first decode context again (figure_details ..._nosmi)")
    ap.add_argument("--deadline-s", type=float, help="start no measurement after this many seconds (JSON is always written)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where the JSON files are written and read")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
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

# --------------------------------------------------------------------------------------------------------------
# the model directory and the plugin's registration in every process
# --------------------------------------------------------------------------------------------------------------

def model_config(name:str)->SolarOpen2Config:
    "The config served, with Nota's compressed-tensors NVFP4 block (experts NVFP4, every other linear BF16)."
    from solar_open2 import nvfp4
    from solar_open2.checkpoint import bf16_linear_modules
    if name not in PRESETS: raise ValueError(f"--config {name!r}: expected one of {tuple(PRESETS)}")
    cfg = SolarOpen2Config.tiny() if name == "tiny" else SolarOpen2Config.real()
    if name == "rank": cfg = budget.rank_config(cfg, RANK_OF_TP)
    cfg.quantization_config = nvfp4.quantization_config("compressed-tensors", bf16_linear_modules(cfg))
    return cfg

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

def write_plugin_shim(root:Path, entry_point:str=ENTRY_POINT, group:str=ENTRY_POINT_GROUP)->Path:
    "A minimal `*.dist-info` under `root` declaring `entry_point` in `group`; put `root` on sys.path/PYTHONPATH."
    d = Path(root) / SHIM_DIST
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: solar_open2_perf_plugin_shim\nVersion: 0.0.0\n")
    (d / "entry_points.txt").write_text(f"[{group}]\n{entry_point}\n")
    return Path(root)

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
    if os.environ.get("VLLM_PLUGINS") and "solar_open2" not in os.environ["VLLM_PLUGINS"].split(","):
        os.environ["VLLM_PLUGINS"] += ",solar_open2"
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
    kw = dict(model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
              tensor_parallel_size=a.tp, max_model_len=a.max_model_len, kv_cache_memory_bytes=a.kv_bytes,
              max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
              enable_prefix_caching=False, seed=0, disable_log_stats=True, distributed_executor_backend="mp")
    if a.moe_backend != "auto": kw["moe_backend"] = a.moe_backend
    att = {k: v for k, v in (("backend", a.attention_backend), ("flash_attn_max_num_splits_for_cuda_graph", a.attn_max_splits))
           if v is not None}
    if att: kw["attention_config"] = att
    ac = {key: getattr(a, dest) for dest, key, _ in PLUGIN_KEYS if getattr(a, dest) is not None}
    if ac: kw["additional_config"] = ac
    if phase == "eager": kw["enforce_eager"] = True
    else:
        cc = {"cudagraph_capture_sizes": sorted(a.capture_sizes)}
        if a.compile == "none": cc.update(mode=0, cudagraph_mode="FULL_DECODE_ONLY")
        if a.allreduce_fusion is not None: cc["pass_config"] = {"fuse_allreduce_rms": a.allreduce_fusion}
        if a.compile_sizes: cc["compile_sizes"] = sorted(a.compile_sizes)
        if a.max_autotune: cc["inductor_compile_config"] = {"max_autotune": True}
        kw["compilation_config"] = cc
    if profile_dir:
        kw["profiler_config"] = dict(profiler="torch", torch_profiler_dir=str(profile_dir),
                                     torch_profiler_with_stack=False, torch_profiler_use_gzip=True,
                                     torch_profiler_dump_cuda_time_total=False, torch_profiler_record_shapes=False,
                                     ignore_frontend=True,
                                     delay_iterations=PROFILE_DELAY_STEPS, max_iterations=a.profile_steps)
    return kw

def token_prompt(n:int, vocab:int, seed:int)->list:
    "`n` token ids, deterministic in `seed`, away from the special ids at both ends of the vocabulary."
    import random
    lo, hi = min(1000, vocab // 8), vocab - min(1000, vocab // 8)
    r = random.Random(seed)
    return [r.randrange(lo, hi) for _ in range(n)]

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
# figures from token arrival times
# --------------------------------------------------------------------------------------------------------------

def single_stream_stats(rec:dict)->dict:
    "Prefill (time to first token) and decode rate of one request: rate = (n-1) / (t_last - t_first)."
    t, n = rec["times"], len(rec["times"])
    if n == 0: raise ValueError("request produced no token")
    ttft = t[0] - rec["t_add"]
    out = {"prompt_len": rec["prompt_len"], "tokens": n, "ttft_s": ttft, "prefill_tok_s": rec["prompt_len"] / ttft}
    if n >= 3:
        gaps = [b - a for a, b in zip(t[:-1], t[1:])]
        med = statistics.median(gaps)
        top = sorted(range(len(gaps)), key=lambda i: -gaps[i])[:5]
        out.update(decode_s=t[-1] - t[0], decode_tok_s=(n - 1) / (t[-1] - t[0]),
                   itl_median_ms=1e3 * med, itl_p90_ms=1e3 * sorted(gaps)[int(0.9 * (len(gaps) - 1))],
                   itl_max_ms=1e3 * max(gaps),
                   stall_s=sum(g - med for g in gaps if g > 2 * med),      # time in gaps over twice the median
                   median_tok_s=1.0 / med,                                  # the rate without the stalls
                   itl_top=[[i, round(1e3 * gaps[i], 3)] for i in top])    # [gap index, ms]: where the window lost time
    return out

def batch_stats(recs:list)->dict:
    "Aggregate decode throughput over the window in which every sequence decodes (last first token .. first finish)."
    if not recs or any(len(r["times"]) < 2 for r in recs): raise ValueError("every request must produce >= 2 tokens")
    start = max(r["times"][0] for r in recs)
    end = min(r["times"][-1] for r in recs)
    n_window = sum(sum(1 for x in r["times"] if start < x <= end) for r in recs)
    first_add = min(r["t_add"] for r in recs)
    last = max(r["times"][-1] for r in recs)
    total = sum(len(r["times"]) for r in recs)
    out = {"batch": len(recs), "prompt_len": recs[0]["prompt_len"], "tokens_per_seq": len(recs[0]["times"]),
           "window_s": end - start, "window_tokens": n_window, "e2e_s": last - first_add, "e2e_out_tok_s": total / (last - first_add),
           "ttft_max_s": start - first_add}
    if end > start and n_window >= len(recs):
        out.update(decode_tok_s=n_window / (end - start), window="all-decoding")
    else:                                    # degenerate window (very short runs): every token after each first
        span = last - start
        out.update(decode_tok_s=(total - len(recs)) / span if span > 0 else float("nan"), window="fallback")
    out["per_seq_tok_s"] = out["decode_tok_s"] / len(recs)
    return out

def output_sanity(recs:list)->dict:
    "Dummy weights can produce NaN logits (argmax then repeats one id): distinct ids per request, and a verdict."
    distinct = [len(set(r["tokens"])) for r in recs if r["tokens"]]
    degenerate = bool(distinct) and max(distinct) <= 1 and max(len(r["tokens"]) for r in recs) > 4
    return {"distinct_ids_min": min(distinct, default=0), "distinct_ids_max": max(distinct, default=0),
            "degenerate": degenerate,
            "note": ("every request repeated one token id: the logits are probably NaN/constant, and MoE routing may be "
                     "degenerate too (all tokens to the same experts), which flatters batch figures") if degenerate else ""}

# --------------------------------------------------------------------------------------------------------------
# rooflines
# --------------------------------------------------------------------------------------------------------------

def decode_roofline(cfg:SolarOpen2Config, tp:int, context:float, batch:int=1, bandwidth:float=H200_BANDWIDTH)->dict:
    "The budget chapter's decode ceiling: bytes one rank reads per step at `context`, `batch`; tok/s per sequence and in all."
    ctx = int(round(context))
    per_seq = budget.decode_ceiling(bandwidth, cfg, tp, ctx, batch=batch)
    return {"context": ctx, "batch": batch, "bytes_per_step_per_rank": budget.decode_bytes(cfg, tp, ctx, batch=batch),
            "per_seq_tok_s": per_seq, "aggregate_tok_s": per_seq * batch, "bandwidth_Bps": bandwidth}

def prefill_flops_per_token(cfg:SolarOpen2Config, tp:int, context:int)->float:
    """FLOPs per prompt token per rank: 2 x active weights (lm_head only on the last token: left out), causal
    attention over an average context/2 in the GQA layers, and the KDA chunk algorithm (chunk 64) in the KDA layers."""
    dense = 2 * (cfg.active_params() - cfg.vocab_size * cfg.hidden_size)
    attn = len(cfg.full_attention_layers) * 2 * 2 * cfg.num_attention_heads * cfg.head_dim * context / 2
    H, D = cfg.kda_num_heads, cfg.kda_head_dim
    kda = len(cfg.kda_layers) * H * (2 * 2 * 64 * D + 6 * D * D)
    return (dense + attn + kda) / tp

def prefill_roofline(cfg:SolarOpen2Config, tp:int, context:int, flops:float=H200_BF16_FLOPS)->dict:
    "Compute ceiling of prefill (this script's estimate; the budget chapter models decode only)."
    f = prefill_flops_per_token(cfg, tp, context)
    return {"context": context, "flops_per_token_per_rank": f, "tok_s": flops / f, "peak_flops": flops}

def with_roofline(fig:dict, roof:dict, value_key:str, ceiling_key:str, kind:str)->dict:
    "Attach `fraction_of_roofline` = fig[value_key] / roof[ceiling_key]."
    fig = dict(fig)
    fig.update(value_tok_s=fig[value_key], roofline_tok_s=roof[ceiling_key], roofline_kind=kind, roofline=roof,
               fraction_of_roofline=fig[value_key] / roof[ceiling_key])
    return fig

def n_allreduces(cfg:SolarOpen2Config, tp:int)->int:
    "All-reduces per forward step at TP>1: after each mixer and each MoE (2 per layer) and after the vocab-parallel embedding."
    return 0 if tp == 1 else 2 * cfg.num_hidden_layers + 1

def predicted_step_us(cfg:SolarOpen2Config, tp:int, context:int, batch:int=1, bandwidth:float=H200_BANDWIDTH,
                      allreduce_us:float=38.0)->dict:
    "The bytes-per-token model as time per decode step per kernel family: bytes / bandwidth, all-reduce as latency."
    p = budget.decode_bytes(cfg, tp, context, batch=batch, by_part=True)
    fam = {"dense_gemm": p["gqa_proj"] + p["kda_proj"] + p["shared_expert"] + p["lm_head"] + p["router"],
           "moe": p["routed_experts"], "kda": p["kda_state"], "attention": p["kv_read"] + p["kv_write"],
           "norm_act": p["norms"] + p["embed_row"]}
    us = {k: 1e6 * v / bandwidth for k, v in fam.items()}
    us["allreduce"] = n_allreduces(cfg, tp) * allreduce_us
    us["total"] = sum(us.values())
    return us

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
         "allreduce_fusion_off": [], "errors": [], "n_warnings": 0, "comm_lines": []}
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
            elif key == "engine_config": r["vllm_version_logged"], r[key] = g[0], g[1][:3000]
            elif key == "allreduce_fusion_off":
                if g[0] not in r[key]: r[key].append(g[0])                  # why vLLM left the fusion pass out
    r["autotune"] = autotune_summary(text)
    return r

# --------------------------------------------------------------------------------------------------------------
# KV pool: prediction vs log
# --------------------------------------------------------------------------------------------------------------

def kv_prediction(a)->dict:
    "`solar_open2.budget.plan` for exactly the engine's flags."
    p = budget.plan(tp=a.tp, kv_cache_memory_bytes=a.kv_bytes, max_model_len=a.max_model_len, kv_cache_dtype="auto",
                    block_size=16, prefix_caching=False, max_num_seqs=a.max_num_seqs, cfg=model_config(a.config))
    return {"gpu_kv_cache_tokens": p.gpu_kv_cache_tokens, "max_concurrency": p.max_concurrency,
            "max_concurrency_2dp": round(p.max_concurrency, 2), "num_blocks": p.num_blocks, "block_size": p.block_size,
            "page_bytes": p.layout.page_bytes, "padding_pct": round(p.layout.padding_pct, 2),
            "weights_per_rank_bytes": p.weights_per_rank_bytes, "weights_per_rank_gib": budget.gib(p.weights_per_rank_bytes),
            "kv_bytes_per_request": p.kv_bytes_per_request, "fits": p.fits, "log_lines": p.log_lines,
            "warnings": [w for w in p.warnings if "DGX Spark" not in w]}

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
            "families": fams,
            "top_kernels": [{"name": n[:160], "family": v[0], "count": v[1], "us": round(v[2], 1),
                             "avg_us": round(v[2] / v[1], 2)} for n, v in top]}

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

# --------------------------------------------------------------------------------------------------------------
# results files
# --------------------------------------------------------------------------------------------------------------

def versions()->dict:
    "Versions of the stack (package metadata; no CUDA initialisation)."
    from importlib.metadata import version, PackageNotFoundError
    v = {"python": platform.python_version()}
    for name in ("vllm", "torch", "triton", "flashinfer-python", "transformers", "compressed-tensors", "nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try: v[name] = version(name)
        except PackageNotFoundError: pass
    with contextlib.suppress(Exception):
        import torch; v["torch_cuda"] = torch.version.cuda
    with contextlib.suppress(Exception):
        import vllm; v.setdefault("vllm", vllm.__version__)
    return v

def out_paths(a, name:str)->list:
    "Every place a result file `name` goes: the results directory and, when set, --out ($OUT)."
    ps = [Path(a.results_dir) / name]
    if a.out: ps.append(Path(a.out) / name)
    return ps

def write_json(obj:dict, paths:list)->None:
    text = json.dumps(obj, indent=1, default=str) + "\n"
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp"); tmp.write_text(text); tmp.replace(p)

def settings(a, phase:str)->dict:
    return {"config": a.config, "phase": phase, "tp": a.tp, "max_model_len": a.max_model_len,
            "kv_cache_memory_bytes": a.kv_bytes, "max_num_seqs": a.max_num_seqs,
            "max_num_batched_tokens": a.max_num_batched_tokens, "prefix_caching": False, "dtype": "bfloat16",
            "load_format": "dummy", "quantization": "compressed-tensors NVFP4 (routed experts), BF16 elsewhere",
            "enforce_eager": phase == "eager", "compile": None if phase == "eager" else a.compile,
            "cudagraph_capture_sizes": None if phase == "eager" else sorted(a.capture_sizes),
            "moe_backend_requested": a.moe_backend, "attention_backend_requested": a.attention_backend,
            "attn_max_splits": a.attn_max_splits, **{dest: getattr(a, dest) for dest, _, _ in PLUGIN_KEYS},
            "allreduce_fusion_requested": None if phase == "eager" else a.allreduce_fusion, "variant": a.variant, "only": a.only,
            "compile_sizes": None if phase == "eager" else a.compile_sizes, "max_autotune": phase != "eager" and a.max_autotune,
            "env": dict(a.env or []),
            "decode_contexts": a.decode_contexts, "decode_tokens": a.decode_tokens,
            "prefill_contexts": a.prefill_contexts, "prefill_repeats": a.prefill_repeats, "batch_sizes": a.batch_sizes,
            "batch_prompt": a.batch_prompt, "batch_tokens": a.batch_tokens, "profile": a.profile,
            "profile_steps": a.profile_steps if a.profile else None, "deadline_s": a.deadline_s,
            "smi_interval_ms": a.smi_interval_ms, "smi_ab": a.smi_ab, "smi_during_measure": a.smi_during_measure}

def new_result(a, phase:str, argv:list)->dict:
    return {"schema": SCHEMA, "benchmark": "perf_h200", "phase": phase, "config": a.config, "status": "started",
            "error": None, "command": "python benchmarks/perf_h200.py " + " ".join(argv),
            "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(ROOT), "git_dirty": git_dirty(ROOT), "source_sha256": source_digest(ROOT), "host": platform.node(), "settings": settings(a, phase),
            "versions": None, "gpu": None, "env": None, "plugin": None, "engine": None, "kv_pool": None,
            "memory": None, "figures": {}, "figure_details": {}, "profile": None, "sanity": {}, "skipped": [], "errors": [],
            "timeline": [], "roofline_source": "solar_open2.budget.decode_ceiling, H200 4.8e12 B/s per GPU, same TP/context/batch",
            "config_note": CONFIG_NOTES.get(a.config)}

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
        rec = run_requests(eng, [token_prompt(ctx, vocab, next(seed))], a.decode_tokens, f"dec{ctx}")
        st = single_stream_stats(rec[0]); res["sanity"][f"decode_bs1_ctx{ctx}"] = output_sanity(rec)
        roof = decode_roofline(cfg, a.tp, ctx + a.decode_tokens / 2, 1)
        res["figures"][f"decode_bs1_ctx{ctx}"] = with_roofline(
            {"kind": "decode", "context": ctx, "batch": 1, "tokens": st["tokens"], "itl_median_ms": st.get("itl_median_ms"),
             "decode_tok_s": st["decode_tok_s"]}, roof, "decode_tok_s", "per_seq_tok_s", "decode-bandwidth")
        smi = getattr(a, "_smi", None)
        res["figure_details"][f"decode_bs1_ctx{ctx}"] = {**st, "smi_running": smi is not None and smi.poll() is None}

    def decode_nosmi(ctx):             # the A/B for host-side stalls: stop the nvidia-smi sampler, measure the same again
        stopped = stop_smi(getattr(a, "_smi", None))
        rec = run_requests(eng, [token_prompt(ctx, vocab, next(seed))], a.decode_tokens, f"dec{ctx}-nosmi")
        res["figure_details"][f"decode_bs1_ctx{ctx}_nosmi"] = {**single_stream_stats(rec[0]), "smi_stopped": stopped}

    def prefill(ctx):                  # time to first token with max_tokens=1, best of the repeats
        runs = [single_stream_stats(run_requests(eng, [token_prompt(ctx, vocab, next(seed))], 1, f"pre{ctx}-{i}")[0])
                for i in range(a.prefill_repeats)]
        best = max(runs, key=lambda r: r["prefill_tok_s"])
        fig = with_roofline({"kind": "prefill", "context": ctx, "batch": 1, "ttft_s": best["ttft_s"],
                             "prefill_tok_s": best["prefill_tok_s"], "chunk_tokens": a.max_num_batched_tokens,
                             "runs_tok_s": [r["prefill_tok_s"] for r in runs]},
                            prefill_roofline(cfg, a.tp, ctx), "prefill_tok_s", "tok_s", "prefill-compute")
        fig["decode_roofline_tok_s"] = decode_roofline(cfg, a.tp, ctx, 1)["per_seq_tok_s"]
        res["figures"][f"prefill_ctx{ctx}"] = fig

    def batch(b):
        recs = run_requests(eng, [token_prompt(a.batch_prompt, vocab, next(seed)) for _ in range(b)], a.batch_tokens, f"bat{b}")
        st = batch_stats(recs); res["sanity"][f"decode_bs{b}"] = output_sanity(recs)
        roof = decode_roofline(cfg, a.tp, a.batch_prompt + a.batch_tokens / 2, b)
        res["figures"][f"decode_bs{b}"] = with_roofline(
            {"kind": "batch", "context": a.batch_prompt, "batch": b, "decode_tok_s": st["decode_tok_s"],
             "per_seq_tok_s": st["per_seq_tok_s"], "window": st["window"]},
            roof, "decode_tok_s", "aggregate_tok_s", "decode-bandwidth")
        res["figure_details"][f"decode_bs{b}"] = st

    def profile():
        res["profile"] = run_profile(a, llm, cfg, vocab, next(seed))

    plan = [("warmup", 60, warmup, ())]
    plan += [(f"decode_bs1_ctx{c}", 60 if c > 8192 else 40, decode, (c,)) for c in a.decode_contexts]
    plan += [(f"decode_bs1_ctx{a.decode_contexts[0]}_nosmi", 40, decode_nosmi, (a.decode_contexts[0],))] if a.smi_ab else []
    plan += [(f"prefill_ctx{c}", (20 + 10 * a.prefill_repeats) * (c / 32768 + 0.5), prefill, (c,)) for c in a.prefill_contexts]
    plan += [(f"decode_bs{b}", 45, batch, (b,)) for b in a.batch_sizes]
    plan += [("profile", 90, profile, ())] if a.profile else []
    kind = lambda label: "profile" if label == "profile" else "decode" if label.startswith("decode_bs1_") else \
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
    t = time.perf_counter()
    llm.start_profile()
    run_requests(llm.llm_engine, [token_prompt(ctx, vocab, seed)], PROFILE_DELAY_STEPS + a.profile_steps + 8, "prof")
    llm.stop_profile()
    traces = []
    for _ in range(60):                                              # rank 1 may still be writing
        traces = find_traces(d)
        if len(traces) >= a.tp: break
        time.sleep(1)
    if not traces: return {"error": f"no trace files in {d}", "seconds": time.perf_counter() - t}
    trace = load_trace(traces[0])
    s = summarize_trace(trace)                                       # steps counted from vLLM's step annotations
    if not s["steps"]: s = summarize_trace(trace, steps=a.profile_steps) | {"steps_source": "requested"}
    s["steps_requested"] = a.profile_steps
    s.update(trace_file=traces[0].name, trace_bytes=traces[0].stat().st_size, context=ctx, batch=1,
             seconds=round(time.perf_counter() - t, 1))
    pred = predicted_step_us(cfg, a.tp, ctx)
    s["predicted_us_per_step"] = {k: round(v, 1) for k, v in pred.items()}
    s["vs_prediction"] = compare_profile(s, pred)
    if a.keep_trace and a.out and traces[0].stat().st_size < 15 * 2**20:
        shutil.copy(traces[0], Path(a.out) / f"{run_name(a.config, a._phase, a.variant)}_trace_rank0{''.join(traces[0].suffixes[-2:])}")
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
    save = lambda: write_json(res, paths)
    work = Path(tempfile.mkdtemp(prefix=f"solar_open2_{name}_"))
    log_path = (Path(a.out) if a.out else work) / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists(): log_path.unlink()
    shim = None
    if not a.no_shim and installed_entry_point() is None: shim = write_plugin_shim(work / "plugin_shim")
    res["env"] = setup_environment(shim, dict(a.env or []))
    res["gpu"] = gpu_info()
    res["kv_pool"] = {"predicted": kv_prediction(a)}
    cfg = model_config(a.config)
    res["roofline"] = {"decode": {str(c): decode_roofline(cfg, a.tp, c + a.decode_tokens / 2) for c in a.decode_contexts},
                       "batch": {str(b): decode_roofline(cfg, a.tp, a.batch_prompt + a.batch_tokens / 2, b) for b in a.batch_sizes},
                       "prefill": {str(c): prefill_roofline(cfg, a.tp, c) for c in a.prefill_contexts},
                       "predicted_step_us": {str(c): predicted_step_us(cfg, a.tp, c) for c in a.decode_contexts}}
    save()
    rc, llm = 0, None
    with LogCapture(log_path) as cap, smi_monitor(work / "smi.csv", a.smi_interval_ms) as smi:
        a._smi = smi
        try:
            res["plugin"] = {"register": register_plugin(), "shim": str(shim) if shim else None,
                             "entry_point_seen": str(installed_entry_point())}
            res["versions"] = versions()
            from vllm import LLM
            model_dir = write_model_dir(a.config, model_dir_for(a))
            a._profile_dir = str(work / "profile") if a.profile else None
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
    lines = [f"{res.get('phase')} [{res.get('status')}] {res.get('error') or ''}".rstrip()]
    for k, f in res.get("figures", {}).items():
        lines.append(f"  {k:22s} {f['value_tok_s']:10.1f} tok/s  = {100 * f['fraction_of_roofline']:5.1f}% of "
                     f"{f['roofline_kind']} roofline {f['roofline_tok_s']:.1f}")
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

# --------------------------------------------------------------------------------------------------------------
# merge, acceptance, the prediction-vs-outcome log
# --------------------------------------------------------------------------------------------------------------

ACCEPT_GRAPHS_OVER_EAGER = 2.0
ACCEPT_FRACTION = 0.60

def merge(eager:dict|None, graphs:dict|None)->dict:
    "One summary of both phases: each figure's eager and graphs values, their ratio, and the acceptance checks."
    phases = {k: v for k, v in (("eager", eager), ("graphs", graphs)) if v}
    if not phases: raise ValueError("nothing to merge: neither phase has results")
    keys = sorted({k for r in phases.values() for k in r.get("figures", {})}, key=_figure_order)
    rows = []
    for k in keys:
        e, g = (phases.get(p, {}).get("figures", {}).get(k) for p in ("eager", "graphs"))
        any_ = e or g
        rows.append({"figure": k, "kind": any_["kind"], "context": any_.get("context"), "batch": any_.get("batch"),
                     "roofline_tok_s": any_["roofline_tok_s"], "roofline_kind": any_["roofline_kind"],
                     "eager_tok_s": e and e["value_tok_s"], "graphs_tok_s": g and g["value_tok_s"],
                     "eager_fraction": e and e["fraction_of_roofline"], "graphs_fraction": g and g["fraction_of_roofline"],
                     "graphs_over_eager": (g["value_tok_s"] / e["value_tok_s"]) if e and g else None})
    first = next(iter(phases.values()))
    d2k = next((r for r in rows if r["kind"] == "decode" and r["batch"] == 1), None)
    kv = {p: (r.get("kv_pool") or {}).get("comparison") for p, r in phases.items()}
    moe = {p: ((r.get("engine") or {}).get("log_final") or {}).get("nvfp4_moe_backend") for p, r in phases.items()}
    acc = {"graphs_over_eager_decode_bs1": None if not d2k else d2k["graphs_over_eager"],
           "graphs_over_eager_target": ACCEPT_GRAPHS_OVER_EAGER,
           "graphs_fraction_decode_bs1": None if not d2k else d2k["graphs_fraction"], "fraction_target": ACCEPT_FRACTION,
           "decode_bs1_figure": d2k and d2k["figure"],
           "kv_pool_match": {p: c and c.get("match") for p, c in kv.items()}}
    acc["graphs_over_eager_ok"] = None if acc["graphs_over_eager_decode_bs1"] is None else acc["graphs_over_eager_decode_bs1"] >= ACCEPT_GRAPHS_OVER_EAGER
    acc["fraction_ok"] = None if acc["graphs_fraction_decode_bs1"] is None else acc["graphs_fraction_decode_bs1"] >= ACCEPT_FRACTION
    return {"schema": SCHEMA, "benchmark": "perf_h200", "phase": "merged", "config": first.get("config"),
            "phases": {p: {"status": r.get("status"), "command": r.get("command"), "started_utc": r.get("started_utc"),
                           "wall_s": r.get("wall_s"), "versions": r.get("versions"), "gpu": (r.get("gpu") or {}).get("name"),
                           "settings": r.get("settings"), "memory": r.get("memory"), "skipped": r.get("skipped"),
                           "init_s": (r.get("engine") or {}).get("init_s")} for p, r in phases.items()},
            "rows": rows, "kv_pool": kv, "nvfp4_moe_backend": moe, "acceptance": acc,
            "profile": {p: r.get("profile") for p, r in phases.items() if r.get("profile")}}

def _figure_order(k:str):
    kind = 0 if k.startswith("decode_bs1_") else 1 if k.startswith("prefill") else 2
    return (kind, int(re.findall(r"\d+", k)[-1]))

def load_results(results_dir:Path=RESULTS, config:str="real")->dict:
    "{'eager': ..., 'graphs': ..., 'merged': ...} of whatever JSON files exist (None where absent or unreadable)."
    out = {}
    for key, name in (("eager", f"{stem(config)}_eager.json"), ("graphs", f"{stem(config)}_graphs.json"),
                      ("merged", f"{stem(config)}.json")):
        p = Path(results_dir) / name
        try: out[key] = json.loads(p.read_text()) if p.exists() else None
        except json.JSONDecodeError: out[key] = None
    return out

def run_merge(a)->int:
    r = load_results(a.results_dir, a.config)
    if a.out:                                                         # prefer fresher copies in $OUT
        for k, v in load_results(a.out, a.config).items():
            if v and k != "merged": r[k] = v
    try: m = merge(r["eager"], r["graphs"])
    except ValueError as e:
        print(f"perf_h200.py merge: {e} (looked in {a.results_dir})", file=sys.stderr); return 2
    write_json(m, out_paths(a, f"{stem(a.config)}.json"))
    for row in m["rows"]:
        print(f"{row['figure']:22s} eager {row['eager_tok_s'] or float('nan'):9.1f}  graphs {row['graphs_tok_s'] or float('nan'):9.1f}  "
              f"roofline {row['roofline_tok_s']:9.1f}")
    print(json.dumps(m["acceptance"], indent=1))
    return 0

def strip_flags(argv:list, flags:tuple)->list:
    "`argv` without the given value-taking flags (`--flag V` and `--flag=V` forms)."
    out, skip = [], False
    for x in argv:
        if skip: skip = False; continue
        if x in flags: skip = True; continue
        if any(x.startswith(f + "=") for f in flags): continue
        out.append(x)
    return out

def ab_summary(runs:dict)->dict:
    "Figures and profile families of each A/B variant (first = baseline), with each figure's ratio to the baseline."
    names = list(runs)
    base = runs[names[0]] or {}
    out = {"schema": SCHEMA, "benchmark": "perf_h200", "phase": "ab", "baseline": names[0], "variants": {}}
    for n in names:
        r = runs[n] or {}
        figs = r.get("figures", {})
        prof = r.get("profile") or {}
        out["variants"][n] = {
            "status": r.get("status"), "error": r.get("error"), "command": r.get("command"),
            "settings": r.get("settings"), "init_s": (r.get("engine") or {}).get("init_s"),
            "figures": {k: {"value_tok_s": f["value_tok_s"], "fraction_of_roofline": f["fraction_of_roofline"],
                            "itl_median_ms": f.get("itl_median_ms"),
                            "over_baseline": (f["value_tok_s"] / base["figures"][k]["value_tok_s"])
                            if k in base.get("figures", {}) else None} for k, f in figs.items()},
            "profile": {"step_us": prof.get("step_us"), "gpu_busy_fraction": prof.get("gpu_busy_fraction"),
                        "kernels_per_step": (round(sum(x["kernels"] for x in prof.get("families", [])) / prof["steps"], 1)
                                             if prof.get("steps") else None),
                        "families_us_per_step": {x["family"]: x["us_per_step"] for x in prof.get("families", [])}}
            if prof and not prof.get("error") else prof or None}
    return out

# Kept for each later A/B variant: a warm engine start + the measurements, by config. real: 225-237 s to a ready
# engine on 2x H200 (TP2); rank: 66-74 s to ready, 76-85 s in all with --only decode (one H200, 2026-12-01: variants
# a0b, a1-a3); tiny: a guess of the same kind. With rank at 270 the first of three variants in 500 s got 167 s, and a
# cold first engine (200 s to ready) measured nothing.
AB_RESERVE_S = {"real": 270, "rank": 100, "tiny": 60}

def run_ab(a, argv:list)->int:
    "Every `--ab` variant as a graphs-phase child process, one after the other; then `perf_h200_ab.json`."
    t0, rc = time.perf_counter(), 0
    rest = strip_flags(argv, ("--phase", "--deadline-s", "--ab", "--variant"))
    for i, (name, flags) in enumerate(a.ab_variants):
        left = a.deadline_s - (time.perf_counter() - t0)
        share = max(left / (len(a.ab_variants) - i), left - AB_RESERVE_S[a.config] * (len(a.ab_variants) - i - 1))   # the first pays the cold start
        cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", "graphs", "--variant", name,
               "--deadline-s", f"{share:.0f}", *flags, *rest]
        print(f"[perf_h200] ab: {' '.join(cmd)}", flush=True)
        rc = max(rc, subprocess.run(cmd).returncode)
    return max(rc, write_ab(a, argv, read_ab_runs(a)))

def read_ab_runs(a)->dict:
    "The variants' graphs-phase JSON files from --out (preferred) or --results-dir."
    runs = {}
    for name, _ in a.ab_variants:
        ps = [Path(d) / f"{run_name(a.config, 'graphs', name)}.json" for d in (a.out, a.results_dir) if d]
        p = next((p for p in ps if p.exists()), ps[-1])
        try: runs[name] = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError): runs[name] = {"status": "missing", "error": f"no result file {p}"}
    return runs

def write_ab(a, argv:list, runs:dict)->int:
    "`perf_h200_ab.json` from the variants' results, and one line per figure."
    summary = ab_summary(runs)
    summary["command"] = "python benchmarks/perf_h200.py " + " ".join(argv)
    summary["runs"] = {n: {"started_utc": r.get("started_utc"), "host": r.get("host"), "git_commit": r.get("git_commit"),
                           "gpu": (r.get("gpu") or {}).get("name")} for n, r in runs.items()}
    write_json(summary, out_paths(a, f"{stem(a.config)}_ab.json"))
    for n, v in summary["variants"].items():
        for k, f in v["figures"].items():
            print(f"[perf_h200] ab {n:12s} {k:22s} {f['value_tok_s']:9.1f} tok/s  x{f['over_baseline'] or float('nan'):.3f}", flush=True)
    return 0 if all(r.get("figures") for r in runs.values()) else 1

def run_all(a, argv:list)->int:
    "Both phases as child processes (each frees its GPUs on exit), then the merge."
    t0, rc = time.perf_counter(), 0
    rest = strip_flags(argv, ("--phase", "--deadline-s"))
    for i, ph in enumerate(PHASES):
        left = a.deadline_s - (time.perf_counter() - t0)
        share = left * (0.55 if i == 0 else 1.0)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", ph, "--deadline-s", f"{share:.0f}", *rest]
        print(f"[perf_h200] all: {' '.join(cmd)}", flush=True)
        rc = max(rc, subprocess.run(cmd).returncode)
    return max(rc, run_merge(a))

LOG_FILE = "perf_log.jsonl"
LOG_FIELDS = ("date", "change", "figure", "phase", "config", "measured_from", "predicted_tok_s", "measured_tok_s",
              "measured_over_predicted", "baseline_tok_s", "results", "commit", "note")

def log_entry(change:str, figure:str, predicted:float, measured:float|None=None, phase:str="graphs",
              baseline:float|None=None, results:str|None=None, note:str="", commit:str|None=None, date:str|None=None,
              config:str="real", measured_from:str="window")->dict:
    "One row of the prediction-vs-outcome log (what an optimisation step expects, and what it got)."
    if not change or not figure: raise ValueError("a log entry needs --change and --figure")
    if predicted is None or predicted <= 0: raise ValueError(f"--predicted must be a positive tok/s, got {predicted!r}")
    if config not in PRESETS: raise ValueError(f"--config {config!r}: expected one of {tuple(PRESETS)}")
    if measured_from not in MEASURED_FROM: raise ValueError(f"--measured-from {measured_from!r}: expected one of {MEASURED_FROM}")
    return {"date": date or datetime.date.today().isoformat(), "change": change, "figure": figure, "phase": phase,
            "config": config, "measured_from": measured_from,
            "predicted_tok_s": predicted, "measured_tok_s": measured,
            "measured_over_predicted": None if measured is None else round(measured / predicted, 3),
            "baseline_tok_s": baseline, "results": results, "commit": commit, "note": note}

MEASURED_FROM = ("window", "median")   # a figure's tok/s over its whole window, or 1 / its median inter-token time

def measured_value(results:dict, figure:str, measured_from:str="window", source:str="results")->float:
    "The tok/s of `figure` in a phase JSON: its window rate, or 1 / the median inter-token time (host stalls left out)."
    figs = results.get("figures", {})
    if figure not in figs: raise ValueError(f"{source}: no figure {figure!r} (has {sorted(figs)})")
    if measured_from == "window": return figs[figure]["value_tok_s"]
    med = figs[figure].get("itl_median_ms")
    if not med: raise ValueError(f"{source}: figure {figure!r} has no itl_median_ms (not a single-stream decode figure)")
    return 1e3 / med

def cli_log(argv:list)->int:
    ap = argparse.ArgumentParser(prog="perf_h200.py log", description="append one prediction-vs-outcome row to "
                                 f"benchmarks/results/{LOG_FILE}")
    ap.add_argument("--change", required=True, help="what was changed (one line)")
    ap.add_argument("--figure", required=True, help="figure key, e.g. decode_bs1_ctx2048")
    ap.add_argument("--predicted", type=float, required=True, help="predicted tok/s after the change")
    ap.add_argument("--measured", type=float, help="measured tok/s (default: read --results)")
    ap.add_argument("--measured-from", choices=MEASURED_FROM, default="window",
                    help="with --results: the figure's window rate, or 1 / its median inter-token time")
    ap.add_argument("--config", choices=tuple(PRESETS), help="the preset measured (default: --results' config, else real)")
    ap.add_argument("--phase", default="graphs", choices=PHASES)
    ap.add_argument("--results", type=Path, help="phase JSON to read the measured value from")
    ap.add_argument("--baseline", type=float, help="tok/s before the change")
    ap.add_argument("--note", default="")
    ap.add_argument("--log", type=Path, default=RESULTS / LOG_FILE)
    a = ap.parse_args(argv)
    measured, config = a.measured, a.config
    try:
        if a.results:
            res = json.loads(a.results.read_text())
            config = config or res.get("config", "real")
            if measured is None: measured = measured_value(res, a.figure, a.measured_from, str(a.results))
        e = log_entry(a.change, a.figure, a.predicted, measured, a.phase, a.baseline,
                      str(a.results) if a.results else None, a.note, git_commit(ROOT), config=config or "real",
                      measured_from=a.measured_from)
    except (ValueError, OSError, json.JSONDecodeError) as err:
        print(f"perf_h200.py log: {err}", file=sys.stderr); return 2
    a.log.parent.mkdir(parents=True, exist_ok=True)
    with open(a.log, "a") as f: f.write(json.dumps(e) + "\n")
    print(json.dumps(e))
    return 0

def read_log(path:Path=RESULTS / LOG_FILE)->list:
    "The prediction-vs-outcome log as a list of dicts ([] when absent)."
    p = Path(path)
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []

def cli_layers(argv:list)->int:
    "`perf_h200.py layers TRACE`: the kernels of each kind of segment between two all-reduces, as a table."
    ap = argparse.ArgumentParser(prog="perf_h200.py layers", description=cli_layers.__doc__)
    ap.add_argument("trace", type=Path, help="a torch-profiler Chrome trace (.json or .json.gz), e.g. one kept by --keep-trace")
    a = ap.parse_args(argv)
    if not a.trace.exists(): ap.error(f"no such trace file: {a.trace}")
    for kind, seg in layer_segments(load_trace(a.trace)).items():
        print(f"{kind}: {seg['segments']} segments, {seg['with_signature']} with the sequence below; median kernels "
              f"{seg['kernel_us']} us, span {seg['span_us']} us")
        for k in seg["kernels"]: print(f"  {k['us']:8.2f} us  stream {k['stream']}  {k['name']}")
    return 0

def main(argv:list|None=None)->int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["log"]: return cli_log(argv[1:])
    if argv[:1] == ["layers"]: return cli_layers(argv[1:])
    a = parse_args(argv)
    if a.phase == "merge": return run_merge(a)
    if a.phase == "all": return run_all(a, argv)
    if a.phase == "ab": return run_ab(a, argv)
    if a.phase == "ab-merge": return write_ab(a, argv, read_ab_runs(a))
    return run_phase(a, a.phase, argv)

if __name__ == "__main__":
    sys.exit(main())
