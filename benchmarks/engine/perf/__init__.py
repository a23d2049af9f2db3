"""Full-size Solar-Open2 on H200 through the vLLM plugin: decode, prefill, CUDA graphs vs eager, KV pool, profile.

    python -m benchmarks.engine.perf --phase eager  [--profile]   # one engine, enforce_eager=True
    python -m benchmarks.engine.perf --phase graphs [--profile]   # one engine, torch.compile + CUDA graphs
    python -m benchmarks.engine.perf --phase merge                # CPU only: eager + graphs JSON -> perf_h200.json
    python -m benchmarks.engine.perf --phase all [--profile]      # eager, graphs (child processes), merge
    python -m benchmarks.engine.perf --phase ab --ab separate=--no-fuse-kda-proj --ab fused= \
        --only decode,profile --profile                            # graphs-phase variants back to back, one job
    python -m benchmarks.engine.perf --phase ab-merge --ab separate= --ab fused=   # CPU: the A/B summary from their JSON
    python -m benchmarks.engine.perf --config rank --phase graphs --only decode     # one TP2 rank on one GPU
    python -m benchmarks.engine.perf --config tiny --phase all    # dry run of the whole harness on one GPU (TP1)
    python -m benchmarks.engine.perf log --change TEXT --figure NAME --predicted X [--measured Y | --results FILE]
    python -m benchmarks.engine.perf layers TRACE                 # a kept trace's layers, kernel by kernel

The engine serves the REAL `SolarOpen2Config.real()` written as `config.json` with the compressed-tensors NVFP4
`quantization_config` block of Nota's checkpoint (`solar_open2.nvfp4.quantization_config` over the ignore list
`solar_open2.checkpoint.bf16_linear_modules`), random weights of the real shapes (so the real kernels and bytes):
by default `--dummy-weights realistic-v1`, the plugin's load format `solar_open2_dummy` (chapter `vllm/dummy`:
vLLM's dummy loader, then finite in-range E4M3 block scales and global scales of the real kind, BF16 weights at a
trained-like std, a router that spreads tokens over the experts like a trained one; the distribution assumed is
written into the JSON as `dummy_weights`), or `--dummy-weights vllm`, vLLM's plain `load_format="dummy"`, for A/Bs
against older runs; `skip_tokenizer_init=True` (token-id prompts), TP2, prefix caching off, an explicit
`kv_cache_memory_bytes` so that `solar_open2.budget.plan` predicts the KV pool exactly. `--config rank` serves one
TP2 rank of it (`solar_open2.budget.rank_config`) at TP1: the per-rank shapes, kernels and bytes on one GPU, without
the all-reduces.

One phase = one engine = one process. Measured in order (each figure is written to the JSON as soon as it exists,
and no measurement starts after `--deadline-s`): warm-up; single-stream decode at each `--decode-contexts`
(prompt of that many tokens, then `--decode-tokens` greedy tokens); prefill at each `--prefill-contexts`
(max_tokens=1, repeated on other prompts, best kept); batch decode at each `--batch-sizes` (that many
`--batch-prompt`-token prompts at once, `--batch-tokens` each, throughput over the window in which all of them
decode); with `--profile` the torch profiler (vLLM's `profiler_config`) over a few decode steps, summarised by
kernel family. Every figure carries its fraction of the H200 decode roofline of `solar_open2.budget.decode_ceiling`
(4.8 TB/s, same TP, same context and batch); prefill figures also carry a compute ceiling (989 TFLOP/s dense BF16).

The sanity gate: dummy weights can give NaN logits, and then every request repeats one token id and the MoE routing
may collapse onto a few experts, which flatters the figure (vLLM's plain dummy weights route every token to the same
8 experts: its random router bias outweighs logits computed from hidden states its norm weights shrink 1000x). Every figure is checked (decode: distinct ids per
request; prefill: distinct first tokens across prompts), and the JSON writer reports as a result only the figures
whose check passed; the others move to `gated_out`, with the check. The merge and the A/B summary read every phase
through the same gate, so a file written before it cannot bring a failed figure into a summary.

From the engine log (captured at the file-descriptor level, so the engine-core and worker processes are included):
the KV pool vLLM reports ("GPU KV cache size: N tokens", "Maximum concurrency ...") against the budget's
prediction, the NvFp4 MoE backend vLLM selected, the attention backend, hybrid block size, model-loading memory,
init / compile / graph-capture times. Peak memory per GPU from `nvidia-smi`, sampled every 0.5 s through the engine
start and warm-up, plus one sample at the end (a sampler running through the measurements stalled one decode
window by 317 ms).

Outputs: `benchmarks/results/incoming/perf_h200_<phase>.json` (`--results-dir`) and, when `$OUT` is set,
`$OUT/perf_h200_<phase>.json` plus the engine log `$OUT/perf_h200_<phase>.log` (`--config rank` and `tiny` write
`perf_h200_<config>_*`; `--variant V` appends `_V`). File a run's results with `python -m benchmarks.index add`.

A/B (`--phase ab`): each `--ab NAME=FLAGS` runs as its own graphs-phase child process (`--variant NAME` plus FLAGS
plus every other flag given), one after the other in the same job, on the same machine, with the same settings;
then `perf_h200_ab.json` holds each variant's figures and profile families and every figure's ratio to the first
variant. `--only` limits the measurements (warm-up always runs) to save engine time. The A/B gives each later
variant `AB_RESERVE_S[config]`, which assumes warm caches: on a fresh machine a first engine can spend 466 s before
it is ready (flashinfer's all-reduce JIT, vLLM's profiling/warm-up), past its allotment. Warm the caches in an
earlier call with the same flags and `--only warmup`.

Speculative decoding (`--draft-head K`): the engine serves a random-weight EAGLE-3 head of the published Solar draft's
shape (`benchmarks.engine.spec.write_eagle3_draft`: five taps at the served model's depths, a 32,768-token draft
vocabulary through vLLM's d2t) proposing K tokens a step. Its drafts are rejected, so every step verifies 1 + K tokens
and yields one: the decode figures are then the cost of a verify step (and of the small head), which the A/B of
K = 0, 1, 3, ... sets against the plain step (`scripts/device/checks.sh spec-rank`). The acceptance a real head or
ngram reaches comes from `benchmarks.engine.spec` on the trained tiny checkpoint; tokens a step times these step
times give the speed-up.

End to end (`--ngram K`): vLLM's ngram proposer (prompt lookup over n-grams of 2 to 4 tokens, up to K tokens a step)
with the engine's stats on, so each decode figure carries vLLM's counters: acceptance (accepted / proposed) and mean
accepted length (tokens one verify step yields), next to tok/s; `tokens_per_step` and the step gaps count the tokens
a step delivers together as one step. `--prompt-period P` makes each decode prompt one random P-token block repeated;
the figure records the continuation's `period` (it repeats every P ids, or None). What the proposer can match is the
dummy weights' own continuation, not a real model's: the acceptance of a trained model on real text differs
`--ngram-gpu` serves vLLM's GPU proposer (`ngram_gpu`) instead, with which vLLM keeps asynchronous scheduling: with
the host proposer it turns it off, and the host's proposer and bookkeeping then sit between the steps' graphs
(`scripts/device/checks.sh spec-e2e`: none vs ngram k = 3 with drafts padded to k, host and GPU proposer).

The plugin: the harness calls `solar_open2.vllm.register()` itself, and, unless a `solar_open2` entry point is
already installed, writes a throw-away `*.dist-info` holding the `vllm.general_plugins` entry point
`solar_open2 = solar_open2.vllm:register` into a temporary directory that it puts (with the repository root) on
PYTHONPATH, so that every process vLLM starts (forked or spawned engine core, workers, the registry's inspection
subprocess) finds it through `load_general_plugins()`. No pip install is needed.
"""
from benchmarks.engine.perf.cli import *          # noqa: F401,F403  (the public face: every module's names)
from benchmarks.engine.perf.figures import *      # noqa: F401,F403
from benchmarks.engine.perf.enginelog import *    # noqa: F401,F403
from benchmarks.engine.perf.trace import *        # noqa: F401,F403
from benchmarks.engine.perf.results import *      # noqa: F401,F403
from benchmarks.engine.perf.log import *          # noqa: F401,F403
from benchmarks.engine.perf.run import *          # noqa: F401,F403
from benchmarks.engine.perf.main import main      # noqa: F401
