"""GPU parity of the vLLM plugin against the reference model, on the tiny checkpoints.

    python -m benchmarks.engine.parity [--cases FORMAT:MODE:DTYPE ...] [--tokens 64] [--noise-factor 2]
                                       [--weights trained|random|FILE] [--min-recall 0.95] [--traps]
                                       [--out DIR] [--name gpu_parity] [--workdir DIR] [--deadline-s 560]

For each tiny checkpoint (`solar_open2.checkpoint.make_tiny`: Nota's NVFP4 compressed-tensors layout and its BF16
twin with the dequantised experts) and each mode (`eager`: `enforce_eager=True`; `graphs`: torch.compile with
piecewise + full CUDA graphs), it runs `vllm.LLM` through the plugin in a fresh subprocess with greedy decoding of
`--tokens` new tokens for several token-id prompts (lengths 5 to 200, one run per prompt and one batched run), keeping
each new token's logprob. Then it runs the reference model (`solar_open2.model`, pure torch, fp32) on the same
checkpoint and compares:

* tokens: teacher-forced on vLLM's sequence, whether each vLLM token is the reference's argmax (if all are, the
  reference's own greedy continuation is the same sequence, by induction); a mismatch where the reference's top-2
  margin is below `--tie-nats` is counted as a near-tie, not a failure;
* logprobs: |vLLM logprob - reference log-softmax| for the chosen token and for vLLM's top-20 tokens at every position;
* eager vs graphs: identical tokens and the logprob difference;
* with trained weights (`--weights trained`, the default; `--weights random` gives the old token-id prompts): the
  prompts are the training corpus's tasks (`text_prompts`), and each engine also answers `behaviour_tasks` greedily:
  the 40 capitals in the chat template, 256 recall queries after 32 key-value pairs (each key 40+ tokens back, beyond
  one KDA chunk), 16 copies of 40 words. Gates: recall >= --min-recall (0.95), facts >= --min-facts (0.95), no task
  more than --behaviour-drop (0.03) below the fp32 reference's teacher-forced score (copying is otherwise only reported).
  With `--traps` each eager engine answers them again with each of the reference's traps planted in its workers
  (`solar_open2.vllm.model.plant_trap`: beta not doubled, the decay gate twice, no GQA output gate, no shared expert;
  chapter `train`'s negative controls): every trap must take its behaviours the margins of `train.TRAP_CAUGHT` below
  `train.BEHAVIOUR_FLOORS`, as it does in the reference, or the run fails (graphs cases skip it: a captured graph
  replays what it captured).

With `--slice N` the checkpoint is a real-shapes slice instead (`solar_open2.checkpoint.make_slice`: the real config's
first N layers, random weights, Nota's NVFP4 layout, drawn on the GPU at run time), so the plugin's kernels run at
the shapes their tables name; the prompts are token ids of 5, 130, 700 and 4,096 tokens (`slice_prompts`). With
`--slice-rank` the slice is cut from one TP2 rank of the real model instead (`slice_base`: `budget.rank_config`, the
per-rank widths served at TP1), so the kernels whose tile tables name only the TP2 rank's shapes (the GEMV pairs)
are given too and must launch; its prompts stay inside the rank's half of the vocabulary. Every
engine also reports, per worker, which kernels the plugin gave the model and which launched
(`solar_open2.vllm.model.LaunchProbe`); a kernel given to some layer that never launched is a failure.

Pass: every vLLM token is the reference's argmax (near-ties excepted); fp32 cases: top-20 max |dlogprob| <=
--logprob-tol (`FP32_MAX_TOL`) and mean <= --logprob-mean-tol (`FP32_MEAN_TOL`); bf16 cases: top-20 mean |dlogprob|
within --noise-factor (2) x the bf16 reference's own deviation from fp32 on the same sequence + 0.01 (vLLM computes in
bf16; NVFP4 runs through Marlin W4A16 on Hopper, i.e. the same dequantised weights); eager == graphs in tokens, bf16
near-ties apart (`mode_divergences`). The tiny checkpoint (version 2)
has a successor map in its `lm_head` so that its top-2 margins are nats wide and BF16 rounding cannot flip a greedy
token (chapter 06); on it, dropping the beta doubling moves the top-20 logprobs ~3.5x the BF16 noise. Writes
`<name>.json` (default `gpu_parity.json`) and one engine log per run to --out (default: $OUT if set, else
benchmarks/results/incoming/) and exits 1 if any check fails.

The plugin must be visible to every process vLLM starts. If the checkout is installed (`pip install --no-deps -e .`
declares the `vllm.general_plugins` entry point) that is all; otherwise the script writes a throw-away `*.dist-info`
declaring the same entry point into a temporary directory and puts it, with the repository root, on the children's
PYTHONPATH (as the engine benchmark, `benchmarks.engine.perf`, does), so vLLM's own `load_general_plugins()` finds it in the engine core
and the workers. The JSON records which.
"""
import argparse, importlib.metadata, json, os, platform, sys, tempfile, time
from pathlib import Path

from benchmarks.common import INCOMING, ROOT, child_timeout, command_line, git_commit, git_dirty, run_logged, source_digest

MODULE = "benchmarks.engine.parity"     # each engine runs in a child process of this module
FORMATS = ("compressed-tensors", "bf16")
MODES = ("eager", "graphs")
TOPK = 20   # logprobs returned per position (vLLM's default max_logprobs)
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
       "VLLM_USE_FLASHINFER_SAMPLER": "0", "TRITON_CACHE_AUTOTUNING": "1", "PYTHONUNBUFFERED": "1"}


def id_prompts(lengths: tuple, coeffs: tuple, lo: int, hi: int) -> list:
    "Deterministic token-id prompts, one per length: id i is `lo + (a i^2 + b i + n) mod (hi - lo)`, (a, b) from `coeffs`."
    return [[lo + (a * i * i + b * i + n) % (hi - lo) for i in range(n)] for n, (a, b) in zip(lengths, coeffs)]


def prompts(vocab: int = 1024, first: int = 142) -> list:
    "Deterministic token-id prompts (no special tokens): short, one chunk, several chunks, 200 tokens."
    return id_prompts((5, 17, 64, 130, 200), ((7, 3), (13, 5), (29, 11), (31, 17), (37, 19)), first, vocab)


def text_prompts() -> list:
    """Five prompts for trained weights (chapter `train`'s tasks, 5 to 200 tokens): a capital in the chat template, a
    capital as a sentence, a recall query after 32 pairs, a copy of 40 words, the tokenizer corpus's first 200 tokens."""
    from solar_open2.checkpoint import TINY_CORPUS
    from solar_open2.train import Words, copy_prompts, facts_pairs, recall_queries
    w = Words()
    return [w.enc(facts_pairs(True)[0][0]), w.enc(facts_pairs(False)[1][0]), recall_queries(w, n=1)[0][0],
            copy_prompts(w, n=1)[0][0], w.enc(TINY_CORPUS)[:200]]


SLICE_LENGTHS = (5, 130, 700, 4096)   # the real-shapes slice's prompts: short, one KDA chunk, the fp32 tail's 700, 4K


SLICE_RANK_TP = 2                     # --slice-rank: the slice of one rank of the real model at this TP (the served TP2)


def slice_base(rank: bool):
    "The config a slice is cut from: the real one, or with `rank` one TP2 rank of it (`budget.rank_config`) served at TP1."
    if not rank: return None
    from solar_open2 import budget
    from solar_open2.config import SolarOpen2Config
    return budget.rank_config(SolarOpen2Config.real(), SLICE_RANK_TP)


def slice_prompts(vocab: int = 196608, lengths: tuple = SLICE_LENGTHS) -> list:
    "Deterministic token-id prompts for the real-shapes slice (its vocabulary, away from the special ids at either end)."
    lo = min(1000, vocab // 8)
    return id_prompts(lengths, ((7, 3), (13, 5), (29, 11), (31, 17)), lo, vocab - lo)


LONG_LENGTHS = (700, 4096)   # the float32 tail: 700 tokens (where it was seen), 4K (where the limits must hold)


def long_prompts(weights: str, lengths: tuple = LONG_LENGTHS) -> list:
    """Long prompts for the tiny checkpoints: token ids (random weights, `prompts`' rule) or the tokenizer corpus
    repeated (trained weights: text the model has seen), cut to `lengths`."""
    if weights == "random":
        return id_prompts(lengths, ((41, 23), (43, 29)), 142, 1024)
    from solar_open2.checkpoint import TINY_CORPUS
    from solar_open2.train import Words
    ids = Words().enc(TINY_CORPUS)
    return [(ids * (n // len(ids) + 1))[:n] for n in lengths]


def prompts_for(weights: str, slice_layers: int = 0, long: bool = False, slice_rank: bool = False) -> list:
    """The parity prompts: token-id sequences for the random weights (`prompts`), the corpus's tasks for trained ones,
    up to 4K token ids for a real-shapes slice (`slice_prompts`, in the rank's vocabulary with `slice_rank`), 700 and
    4,096 tokens with `long` (`long_prompts`)."""
    if slice_layers: return slice_prompts(slice_base(True).vocab_size) if slice_rank else slice_prompts()
    if long: return long_prompts(weights)
    return prompts() if weights == "random" else text_prompts()


def behaviour_tasks() -> dict:
    """What trained weights must do, as (prompt ids, expected ids) per task, for greedy decoding: the 40 capitals in
    the chat template, the 256 recall queries of `train.recall_accuracy` (after 32 pairs, key 40+ tokens back, one token
    each), 16 copies of 40 words (41 decoded tokens each)."""
    from solar_open2.train import Words, copy_prompts, encode_pair, facts_pairs, recall_queries
    w = Words()
    return {"facts": [encode_pair(w, p, a) for p, a in facts_pairs(True)],
            "recall": [(p, [v]) for p, v in recall_queries(w)], "copy": copy_prompts(w)}


def behaviour_reference(m) -> dict:
    "The reference model's scores on `behaviour_tasks` (teacher-forced, i.e. exactly what greedy decoding prints)."
    from solar_open2.train import copy_accuracy, facts_accuracy, recall_accuracy
    return {"facts": facts_accuracy(m)["chat"], "recall": recall_accuracy(m)["accuracy"], "copy": copy_accuracy(m)}


def plugin_entry_point() -> bool:
    return any(ep.value == "solar_open2.vllm:register"
               for ep in importlib.metadata.entry_points(group="vllm.general_plugins"))


def entry_point_shim(root: Path) -> Path:
    "A minimal `*.dist-info` under `root` declaring the plugin's entry point; put `root` on PYTHONPATH."
    d = root / "solar_open2_parity_plugin_shim-0.0.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: solar_open2_parity_plugin_shim\nVersion: 0.0.0\n")
    (d / "entry_points.txt").write_text("[vllm.general_plugins]\nsolar_open2 = solar_open2.vllm:register\n")
    return root


# ---- child: one vLLM engine ------------------------------------------------------------------------------------

def run_vllm(model_dir: str, mode: str, n_tokens: int, dtype: str = "bfloat16", additional_config: dict | None = None,
             moe_backend: str = "auto", gemv_probe: bool = False, gpu_memory_utilization: float = 0.3,
             kv_cache_memory_bytes: int | None = None, weights: str = "random", behaviour: bool = False,
             slice_layers: int = 0, long: bool = False, traps: bool = False, slice_rank: bool = False) -> dict:
    """Greedy generation through vLLM for every prompt, alone and as one batch; returns tokens and logprobs, and from
    every worker which of the plugin's kernels the model was given and which launched (`LaunchProbe`).
    A fixed `kv_cache_memory_bytes` skips vLLM's memory profiling, which other engines on the same GPU would upset."""
    if not plugin_entry_point(): raise RuntimeError("the solar_open2 vllm.general_plugins entry point is not visible")
    from vllm import LLM, SamplingParams
    ps = prompts_for(weights, slice_layers, long, slice_rank)
    max_len = max(1024, max(map(len, ps)) + n_tokens + 64)
    kw = dict(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype=dtype, seed=0,
              max_model_len=max_len, max_num_seqs=8, gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=False,
              worker_extension_cls="solar_open2.vllm.model.LaunchProbe")
    if kv_cache_memory_bytes: kw["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    if additional_config: kw["additional_config"] = additional_config
    if moe_backend != "auto": kw["moe_backend"] = moe_backend
    if gemv_probe: kw["hf_overrides"] = {"architectures": ["SolarOpen2GemvProbeForCausalLM"]}   # the plugin's test model (every dense shape through the GEMV kernels)
    if mode == "eager": kw["enforce_eager"] = True
    else: kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8]}
    t0 = time.perf_counter()
    llm = LLM(**kw)
    t_init = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True, detokenize=False, logprobs=TOPK)

    def gen(ps):
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)
        res = []
        for o in outs:
            c = o.outputs[0]
            res.append({"tokens": list(c.token_ids),
                        "logprobs": [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
                        "topk": [{int(i): float(x.logprob) for i, x in lp.items()} for lp in c.logprobs]})
        return res

    t = time.perf_counter()
    single = [gen([p])[0] for p in ps]
    t_single = time.perf_counter() - t
    batched = gen(ps)
    def tasks_out() -> dict:                                 # each task's prompts in one call, greedy, as long as the answers
        out = {}
        for task, items in behaviour_tasks().items():
            sps = [SamplingParams(temperature=0.0, max_tokens=len(a), ignore_eos=True, detokenize=False) for _, a in items]
            outs = llm.generate([{"prompt_token_ids": p} for p, _ in items], sps, use_tqdm=False)
            out[task] = [list(o.outputs[0].token_ids) for o in outs]
        return out

    beh = tasks_out() if behaviour else {}
    beh_traps = {}
    if behaviour and traps and mode == "eager":              # the negative controls, planted in every worker in turn
        from solar_open2.vllm.model import PLANTABLE_TRAPS
        for name in PLANTABLE_TRAPS:
            layers = llm.collective_rpc("solar_trap", args=(name,))
            beh_traps[name] = {"layers": layers, "outputs": tasks_out()}
        llm.collective_rpc("solar_trap", args=(None,))
    try: launches = llm.collective_rpc("solar_launches")                     # per worker: apply's record and the launch counts
    except Exception as e: launches = f"{type(e).__name__}: {e}"
    cfg = llm.llm_engine.vllm_config
    return {"init_s": round(t_init, 1), "single_s": round(t_single, 2), "single": single, "batched": batched, "dtype": dtype, "behaviour": beh,
            "behaviour_traps": beh_traps,
            "launches": launches, "max_model_len": max_len,
            "block_size": cfg.cache_config.block_size, "splitting_ops": cfg.compilation_config.splitting_ops,
            "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode), "additional_config": cfg.additional_config,
            "moe_backend": cfg.kernel_config.moe_backend, "architecture": cfg.model_config.architecture,
            "triton_f32_default": os.environ.get("TRITON_F32_DEFAULT")}   # as the launcher or the plugin's config hook left it


# ---- parent: reference, comparisons -----------------------------------------------------------------------------

def load_reference(ckpt_dir: Path, device: str, dtype: str = "float32", cache_experts: bool = True):
    """The reference model (chapter 05) on `ckpt_dir` in `dtype`, NVFP4 experts dequantised once (cached) or, for a
    real-shapes slice (640 experts: 40 GB dequantised in fp32), at every use."""
    import torch
    from solar_open2.model import SolarOpen2ForCausalLM
    return SolarOpen2ForCausalLM.from_pretrained(ckpt_dir, dtype=getattr(torch, dtype), device=device, cache_experts=cache_experts)


def reference_logits(m, ids: list, device: str):
    "The logits at every position of `ids` (one full-sequence forward): [T, V] fp32."
    import torch
    with torch.no_grad():
        logits, _ = m(torch.tensor([ids], device=device))                     # [1, T, V]
        return logits[0].float()


def reference_logprobs(m, ids: list, device: str):
    "log-softmax over the vocabulary at every position of `ids` (one full-sequence forward): [T, V] fp32."
    import torch
    return torch.log_softmax(reference_logits(m, ids, device), -1)


# fp32 engines (the plugin's `fp32_ieee_dots`: Triton's dots in IEEE fp32) against the fp32 reference differ by summation
# order only: top-20 max 1e-4 and mean 1e-5 nats at 700 and 4,096-token prompts (H100, 2026-12-06). The limits leave
# 100x for other GPUs and longer prompts and sit below what TF32 dots give (max 0.020-0.344, mean 0.0022-0.0038 on the
# same prompts), so a TF32 dot brought back fails them.
FP32_MAX_TOL, FP32_MEAN_TOL = 0.01, 0.001

BF16_TIE_ULPS = 2.0   # a bf16 engine's logits are bf16: a top-2 gap under this many bf16 ulps of the logit is a near-tie


def bf16_ulp(x: float) -> float:
    "One bf16 ulp at magnitude `x` (8 significant bits): 2^(floor(log2|x|) - 7)."
    import math
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


def bf16_tie(c: dict, j: int) -> bool:
    "Whether the off-argmax token at position `j` of a comparison `c` (`compare_lp` with logits) is under `BF16_TIE_ULPS` ulps."
    return c.get("gap_ulps", {}).get(str(j), BF16_TIE_ULPS) < BF16_TIE_ULPS


def compare_lp(lp, tokens: list, logprobs: list, tie_nats: float, topk: list | None = None, logits=None) -> dict:
    """Per position: is `tokens[i]` the argmax of the reference log-probs `lp` [n, V] (near-ties apart), |dlogprob| of
    the chosen token, and with `topk` (vLLM's {token id: logprob} per position) |dlogprob| over those tokens. Each
    off-argmax token's gap below the argmax, in nats (`gaps`) and, given the reference `logits` [n, V], in bf16 ulps of
    the argmax logit (`gap_ulps`, for `bf16_tie`)."""
    top2 = lp.topk(2, -1)
    mism, ties, dlp, dk = [], [], [], []
    for i, t in enumerate(tokens):
        dlp.append(abs(logprobs[i] - float(lp[i, t])))
        if t != int(top2.indices[i, 0]):
            (ties if float(top2.values[i, 0] - lp[i, t]) < tie_nats else mism).append(i)
        if topk: dk += [(abs(v - float(lp[i, int(j)])), i, int(j), v) for j, v in topk[i].items()]
    div = min(mism + ties) if mism + ties else None
    out = {"mismatches": mism, "near_ties": ties, "first_divergence": div,
           "gaps": {str(i): round(float(top2.values[i, 0] - lp[i, tokens[i]]), 4) for i in mism + ties},   # fp32 nats below the argmax
           "max_abs_dlogprob": max(dlp), "mean_abs_dlogprob": sum(dlp) / len(dlp),
           "min_top2_margin": float((top2.values[:, 0] - top2.values[:, 1]).min())}
    if topk:
        d, i, j, v = max(dk)                                 # the worst top-k entry: where it is and how unlikely the token is
        out.update(topk_max_abs_dlogprob=d, topk_mean_abs_dlogprob=sum(e[0] for e in dk) / len(dk),
                   topk_worst={"position": i, "token": j, "logprob": round(v, 4), "reference_logprob": round(float(lp[i, j]), 4)})
    if logits is not None: out["gap_ulps"] = {k: round(g / bf16_ulp(float(logits[int(k)].max())), 3) for k, g in out["gaps"].items()}
    return out


def compare(m, prompt: list, got: dict, device: str, tie_nats: float, m16=None) -> dict:
    """Teacher-force vLLM's sequence through the fp32 reference `m`: each vLLM token vs the reference argmax, and the
    logprobs (chosen token and vLLM's top-k). With `m16` (the same reference in bf16) also the noise floor: the bf16
    reference's own argmax and logprobs against the fp32 reference on the same sequence and the same top-k ids; and a
    vLLM token off the fp32 argmax that the bf16 reference also picks there is a measured bf16 flip (`bf16_flips`, its
    fp32 gap in `gaps`), not a mismatch: bf16 rounding alone, in code independent of vLLM, makes the same choice.
    Every off-argmax token's gap is also given in bf16 ulps of the argmax logit (`gap_ulps`; see `judge`)."""
    import torch
    n = len(got["tokens"]); ids = prompt + got["tokens"]
    logits = reference_logits(m, ids, device)[len(prompt) - 1: len(prompt) - 1 + n]       # [n, V]
    lp = torch.log_softmax(logits, -1)                                                     # [n, V]
    out = {"prompt_len": len(prompt), **compare_lp(lp, got["tokens"], got["logprobs"], tie_nats, got.get("topk"), logits)}
    if m16 is not None:
        lp16 = reference_logprobs(m16, ids, device)[len(prompt) - 1: len(prompt) - 1 + n]  # [n, V]
        am = lp16.argmax(-1)                                                               # [n]
        ref16 = compare_lp(lp, am.tolist(), lp16.gather(1, am[:, None])[:, 0].tolist(), tie_nats,
                           [{j: float(lp16[i, int(j)]) for j in got["topk"][i]} for i in range(n)] if got.get("topk") else None)
        flips = [i for i in out["mismatches"] if int(am[i]) == got["tokens"][i]]   # the bf16 reference picks vLLM's token there too
        if flips: out["mismatches"], out["bf16_flips"] = [i for i in out["mismatches"] if i not in flips], flips
        dl16 = (lp16 - lp).gather(1, torch.tensor(got["tokens"], device=lp.device)[:, None]).abs()   # [n, 1]
        out["noise_floor_bf16_reference"] = {"mismatches": len(ref16["mismatches"]), "mean_abs_dlogprob": float(dl16.mean()),
                                             "max_abs_dlogprob": float(dl16.max()),
                                             **{k: ref16[k] for k in ("topk_mean_abs_dlogprob", "topk_max_abs_dlogprob") if k in ref16}}
    return out


def child_main(a) -> int:
    res = run_vllm(a.child_model, a.child_mode, a.tokens, a.child_dtype, a.ac, a.moe_backend, a.gemv_probe,
                   a.gpu_memory_utilization, a.kv_cache_memory_bytes, a.weights, a.weights != "random" and not a.slice, a.slice, a.long,
                   a.traps, a.slice_rank)
    Path(a.child_out).write_text(json.dumps(res))
    return 0


# The default order runs the cases that prove the most first (a cold machine autotunes the KDA kernels per dtype):
# the plugin's math in fp32 against the fp32 reference (tight), then the NVFP4 build in bf16 eager and with CUDA
# graphs, then the BF16 twin in bf16 (judged against the reference's own bf16 noise floor).
DEFAULT_CASES = ("compressed-tensors:eager:bfloat16", "bf16:eager:float32", "compressed-tensors:graphs:bfloat16",
                 "bf16:eager:bfloat16")
# the slice: Nota's format only (its BF16 twin is 20 GB of experts, an fp32 engine 48 GB of weights)
SLICE_CASES = ("compressed-tensors:eager:bfloat16", "compressed-tensors:graphs:bfloat16")


def judge(case: str, dtype: str, cmps: list, a) -> list:
    """Failure lines for one case. Tokens: every vLLM token is the fp32 reference's argmax on vLLM's own sequence
    (near-ties below --tie-nats apart; in a bf16 case also the bf16 reference's own flips on the same sequence, and
    tokens whose fp32 logit is within `BF16_TIE_ULPS` bf16 ulps of the argmax's: the engine's logits are bf16, and each
    of the two carries up to half an ulp of output rounding on top of its upstream bf16 error; on the trained weights
    every divergence of the first GPU run sat at 0.85-1.37 ulps, while 311-313 of each run's 320 positions have
    margins of 2 ulps or more. With the random tiny checkpoint's successor map the smallest margin is ~2 nats).
    Logprobs, over vLLM's top-k tokens at every position: fp32 max |dlogprob| <= --logprob-tol and mean <= --logprob-mean-tol;
    bf16 mean |dlogprob| <= --noise-factor x the bf16 reference's own deviation + 0.01 (dropping the beta doubling
    moves it ~3.5x)."""
    fails = []
    for i, c in enumerate(cmps):
        bad = sorted(c["mismatches"] + (c.get("bf16_flips", []) if dtype == "float32" else []))   # an fp32 engine has no bf16 excuse
        if dtype != "float32": bad = [j for j in bad if not bf16_tie(c, j)]
        if bad: fails.append(f"{case} seq {i}: tokens differ from the fp32 reference's argmax at {bad} "
                             f"(fp32 gaps {[c.get('gaps', {}).get(str(j)) for j in bad]} nats)")
    if dtype == "float32":
        for i, c in enumerate(cmps):
            mx, mean = c.get("topk_max_abs_dlogprob", c["max_abs_dlogprob"]), c.get("topk_mean_abs_dlogprob", c["mean_abs_dlogprob"])
            if mx > a.logprob_tol: fails.append(f"{case} seq {i}: max |dlogprob| {mx:.4f} > {a.logprob_tol}")
            if mean > a.logprob_mean_tol: fails.append(f"{case} seq {i}: mean |dlogprob| {mean:.4f} > {a.logprob_mean_tol}")
        return fails
    key = "topk_mean_abs_dlogprob" if "topk_mean_abs_dlogprob" in cmps[0] else "mean_abs_dlogprob"
    md = sum(c[key] for c in cmps) / len(cmps)
    md16 = sum(c["noise_floor_bf16_reference"][key] for c in cmps) / len(cmps)
    if md > a.noise_factor * md16 + 0.01:
        fails.append(f"{case}: mean |dlogprob| over the top-{TOPK} {md:.4f} vs the bf16 reference's {md16:.4f} (x{a.noise_factor} + 0.01 allowed)")
    return fails


def judge_behaviour(case: str, beh: dict, ref: dict, a) -> list:
    """Failure lines for the trained weights' behaviour through vLLM: recall and facts at least --min-recall /
    --min-facts (copying is reported, not gated), and none more than --behaviour-drop below the reference's score."""
    fails = []
    for task, floor in (("recall", a.min_recall), ("facts", a.min_facts)):
        if beh[task] < floor: fails.append(f"{case}: {task} accuracy {beh[task]:.3f} < {floor}")
    for task, v in beh.items():
        if v < ref[task] - a.behaviour_drop: fails.append(f"{case}: {task} {v:.3f} vs the fp32 reference's {ref[task]:.3f}")
    return fails


def behaviour_scores(outputs: dict) -> dict:
    "Each behaviour task's score from an engine's greedy outputs: the fraction of answers it printed whole."
    tasks = behaviour_tasks()
    return {t: sum(g[:len(x)] == x for g, (_, x) in zip(outputs[t], tasks[t])) / len(tasks[t]) for t in tasks}


def judge_traps(case: str, traps: dict) -> list:
    """Failure lines for the negative controls through vLLM (`--traps`): each trap's behaviour scores must fall the
    margins of `train.TRAP_CAUGHT` below `train.BEHAVIOUR_FLOORS` (the facts task is the chat template's); a trap
    that touched no layer in some worker failed to plant."""
    from solar_open2.train import BEHAVIOUR_FLOORS, TRAP_CAUGHT
    floors = {**BEHAVIOUR_FLOORS, "facts": BEHAVIOUR_FLOORS["chat"]}
    fails = [f"{case}: trap {n} not run" for n in TRAP_CAUGHT if n not in traps]
    for name, t in traps.items():
        if not t.get("layers") or not all(t["layers"]): fails.append(f"{case}: trap {name} planted in no layer of some worker ({t.get('layers')})")
        for task, margin in TRAP_CAUGHT.get(name, {}).items():
            if t["scores"][task] > floors[task] - margin:
                fails.append(f"{case}: trap {name}: {task} {t['scores'][task]:.3f}, not {margin} under its floor {floors[task]}: "
                             "the engine with the trap behaves too well to tell it from the right model")
    return fails


def judge_launches(key: str, launches) -> list:
    """Failure lines for the workers' `LaunchProbe` records: a kernel the model was given that never launched
    (`solar_open2.vllm.model.launch_problems`), or no record (the probe failed). Absent in reports from before it."""
    from solar_open2.vllm.model import launch_problems
    if isinstance(launches, str): return [f"{key}: no kernel launch record ({launches[:300]})"]
    return [f"{key} rank {i}: {p}" for i, w in enumerate(launches) for p in launch_problems(w.get("applied") or {}, w.get("launches") or {})]


def mode_divergences(eager: dict, graphs: dict, dtype: str) -> list:
    """Where the eager and the CUDA-graph runs of one checkpoint and dtype (their `report["runs"]` records: `tokens`
    and the `single` comparisons) part, per prompt: None where the tokens are the same, else the first position `p`
    where they differ, which run left the fp32 argmax there (at least one did: both followed the same sequence up to
    `p`) and its gap in bf16 ulps, and `excused`: a bf16 case where each run off the argmax at `p` is there by a near-tie
    `judge` already excuses (`near_ties`, `bf16_flips`, under `BF16_TIE_ULPS`). Compiled and eager kernels round
    differently, so on weights with near-ties (random real-shape slices: top-2 margins down to 0.002 nats) the two
    modes may take different branches of a tie; an fp32 case, or a divergence where a run is off by more, is not excused."""
    out = []
    for te, tg, ce, cg in zip(eager["tokens"], graphs["tokens"], eager["single"], graphs["single"]):
        if te == tg: out.append(None); continue
        p = next((i for i, (x, y) in enumerate(zip(te, tg)) if x != y), min(len(te), len(tg)))
        off = [(n, c) for n, c in (("eager", ce), ("graphs", cg)) if p in c["mismatches"] + c["near_ties"] + c.get("bf16_flips", [])]
        ok = lambda c: p in c["near_ties"] or p in c.get("bf16_flips", []) or bf16_tie(c, p)
        out.append({"first_divergence": p, "off_argmax": [n for n, _ in off],
                     "gap_ulps": {n: c.get("gap_ulps", {}).get(str(p)) for n, c in off},
                     "excused": dtype == "bfloat16" and bool(off) and all(ok(c) for _, c in off)})
    return out


def judge_run(key: str, r: dict, a) -> list:
    """Failure lines for one entry of `report["runs"]`: a case (`FORMAT:MODE:DTYPE`, its single and batched
    comparisons, its workers' kernel launches) or an `...:eager_vs_graphs` record (identical tokens required, except
    where `divergences` (`mode_divergences`) excuses a bf16 near-tie)."""
    if "single" in r:
        dtype = key.split(":")[2]
        fails = judge(key, dtype, r["single"], a) + judge(key + " (batched)", dtype, r["batched"], a)
        if r.get("behaviour"): fails += judge_behaviour(key, r["behaviour"], r["behaviour_reference"], a)
        if r.get("behaviour_traps"): fails += judge_traps(key, r["behaviour_traps"])
        if r.get("launches") is not None: fails += judge_launches(key, r["launches"])
        return fails
    same, div = r.get("same_tokens", []), r.get("divergences")
    bad = [i for i, x in enumerate(same) if not x and not (div and div[i] and div[i]["excused"])]
    return [] if not bad else [f"{key}: eager and CUDA graphs differ in tokens for prompts {bad}"
                               + (f" (first divergences {[div[i]['first_divergence'] for i in bad]}, not bf16 near-ties)" if div else "")]


def unjudged(failures: list) -> list:
    "The failure lines no re-judgement can revisit: a run that failed, was not run, or split no graphs (no comparison stored)."
    return [f for f in failures if "vLLM run failed" in f or "not run" in f or "splitting ops" in f]


MERGE_SAME = ("git_commit", "source_sha256", "gpu", "versions", "weights", "slice_layers", "slice_rank", "long_prompts",
              "moe_backend", "additional_config", "gemv_probe", "tokens", "tie_nats")   # what two halves of one run must share


def merge(a) -> int:
    """One report from reports that each ran some of the cases of one run (`--merge A.json B.json ...`): a run cut by its
    deadline and finished by a second call, or the halves `TOGETHER=1` starts apart. They must share `MERGE_SAME`
    (the same code, GPU, vLLM, weights and settings: the checkpoints are drawn from the same seed) and no case; the
    result holds every case, the `eager_vs_graphs` records their tokens allow (`mode_divergences`; the logprob
    differences between the modes need the engines' raw outputs, which the reports do not keep), a "not run
    (deadline)" failure only for a case no report ran, and is judged again with the current thresholds; no GPU."""
    files = [Path(f) for f in a.merge]
    reps = []
    for f in files:
        try: reps.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError) as e: print(f"gpu_parity --merge: cannot read {f}: {e}", file=sys.stderr); return 2
    for k in MERGE_SAME:
        vals = {json.dumps(r.get(k), sort_keys=True) for r in reps}
        if len(vals) > 1:
            print(f"gpu_parity --merge: the reports differ in {k!r} ({', '.join(f'{f.name}: {r.get(k)!r}' for f, r in zip(files, reps))}): "
                  "not halves of one run", file=sys.stderr); return 2
    rep = {k: v for k, v in reps[0].items() if k not in ("runs", "failures", "passed", "wall_s", "command", "checkpoint_s")}
    rep["runs"], rep["checkpoint_s"] = {}, {}
    for f, r in zip(files, reps):
        for key, run in r.get("runs", {}).items():
            if key.endswith(":eager_vs_graphs"): continue                        # made again below, over every report's cases
            if key in rep["runs"]: print(f"gpu_parity --merge: case {key} is in more than one report ({f.name})", file=sys.stderr); return 2
            rep["runs"][key] = run
        rep["checkpoint_s"].update(r.get("checkpoint_s") or {})
    kept = [x for r in reps for x in unjudged(r.get("failures", [])) if x.split(": ")[0] not in rep["runs"]]
    for key in list(rep["runs"]):
        fmt, mode, dtype = key.split(":")
        other = f"{fmt}:graphs:{dtype}"
        if mode == "eager" and other in rep["runs"]:
            e, g = rep["runs"][key], rep["runs"][other]
            rep["runs"][f"{fmt}:{dtype}:eager_vs_graphs"] = {"same_tokens": [x == y for x, y in zip(e["tokens"], g["tokens"])], "from_merge": True}
    rep["merged_from"] = [{"file": f.name, "command": r.get("command"), "wall_s": r.get("wall_s"), "failures": r.get("failures", []),
                           "cases": sorted(k for k in r.get("runs", {}) if not k.endswith(":eager_vs_graphs"))} for f, r in zip(files, reps)]
    rep["command"] = command_line()
    rep["wall_s"] = round(sum(r.get("wall_s") or 0 for r in reps), 1)
    rc = _judge_and_write(rep, a, kept)
    print(json.dumps({"passed": rep["passed"], "failures": rep["failures"]}, indent=1))
    return rc


def _judge_and_write(rep: dict, a, fails: list) -> int:
    "Judge every entry of `rep['runs']` (eager_vs_graphs records get their divergences from the stored cases) after `fails`; write `a.out/a.name`.json."
    rep.update(logprob_tol=a.logprob_tol, logprob_mean_tol=a.logprob_mean_tol, noise_factor=a.noise_factor,
               min_recall=a.min_recall, min_facts=a.min_facts, behaviour_drop=a.behaviour_drop)
    fails = list(fails)
    for key, r in rep["runs"].items():
        if key.endswith(":eager_vs_graphs"):                                  # its divergences, from the stored cases
            fmt, dtype, _ = key.split(":")
            r["divergences"] = mode_divergences(rep["runs"][f"{fmt}:eager:{dtype}"], rep["runs"][f"{fmt}:graphs:{dtype}"], dtype)
        fails += judge_run(key, r, a)
    rep["failures"], rep["passed"] = fails, not fails
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"{a.name}.json").write_text(json.dumps(rep, indent=1) + "\n")
    return 0 if rep["passed"] else 1


def rejudge(a) -> int:
    """Re-apply `judge` with the current thresholds to a saved report (its per-sequence comparisons are stored);
    the failures found at run time are kept as `failures_at_run` with the thresholds then in force."""
    rep = json.loads(Path(a.rejudge).read_text())
    rep["rejudged_from"] = {"file": Path(a.rejudge).name, "failures_at_run": rep.get("failures", []),
                            "thresholds_at_run": {k: rep.get(k) for k in ("logprob_tol", "logprob_mean_tol", "noise_factor", "tie_nats", "min_recall", "min_facts", "behaviour_drop")}}
    rc = _judge_and_write(rep, a, unjudged(rep.get("failures", [])))
    print(json.dumps({"passed": rep["passed"], "failures": rep["failures"], "failures_at_run": rep["rejudged_from"]["failures_at_run"]}, indent=1))
    return rc


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=None,
                    help="FORMAT:MODE:DTYPE, format in compressed-tensors|modelopt|bf16, mode eager|graphs, dtype bfloat16|float32 "
                         f"(default: {' '.join(DEFAULT_CASES)}; with --slice: {' '.join(SLICE_CASES)})")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--logprob-tol", type=float, default=FP32_MAX_TOL, help="fp32 cases: max |dlogprob| over the top-20 tokens")
    ap.add_argument("--logprob-mean-tol", type=float, default=FP32_MEAN_TOL, help="fp32 cases: mean |dlogprob| over the top-20 tokens")
    ap.add_argument("--rejudge", metavar="JSON", help="re-apply the checks (current thresholds) to a saved report; no GPU")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="one report from reports that ran some of one run's cases each "
                    "(same code, GPU, settings; no case twice), with eager vs graphs where both modes ran, judged again; no GPU")
    ap.add_argument("--noise-factor", type=float, default=2.0, help="bf16 cases: allowed multiple of the bf16 reference's deviation")
    ap.add_argument("--tie-nats", type=float, default=0.05)
    ap.add_argument("--weights", default="trained", metavar="{trained,random,FILE}",
                    help="the tiny checkpoints' weights (solar_open2.checkpoint.make_tiny): trained (default: text prompts and "
                         "the behaviour tasks too), random (token-id prompts), or a FILE.safetensors from `python -m solar_open2.train`")
    ap.add_argument("--min-recall", type=float, default=0.95, help="trained weights: least recall accuracy through vLLM")
    ap.add_argument("--min-facts", type=float, default=0.95, help="trained weights: least fraction of the 40 capitals (chat template)")
    ap.add_argument("--behaviour-drop", type=float, default=0.03, help="trained weights: most a task's score may fall below the fp32 reference's")
    ap.add_argument("--traps", action="store_true", help="trained weights, eager cases: answer the behaviour tasks again with each of "
                    "the reference's traps planted in the workers (plant_trap), each held to train.TRAP_CAUGHT's margins")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(INCOMING))
    ap.add_argument("--name", default="gpu_parity", help="name of the JSON report (and prefix of the logs)")
    ap.add_argument("--workdir", default=None, help="where the tiny checkpoints are written (default: a temp dir)")
    ap.add_argument("--deadline-s", type=float, default=560, help="stop starting engines after this many seconds")
    ap.add_argument("--child-model"); ap.add_argument("--child-mode"); ap.add_argument("--child-out")
    ap.add_argument("--child-dtype", default="bfloat16")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's gpu_memory_utilization in every run")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="a fixed KV pool in bytes for every run (skips "
                    "vLLM's memory profiling, so several checks can share one GPU); default: from gpu_memory_utilization")
    ap.add_argument("--moe-backend", default="auto", help="vLLM's moe_backend in every run (auto: vLLM chooses, Marlin on Hopper)")
    ap.add_argument("--gemv-probe", action="store_true", help="run the plugin's test model SolarOpen2GemvProbeForCausalLM "
                    "(every unquantized linear shape, the router and the LM head through the GEMV kernels, on any GPU)")
    ap.add_argument("--slice", type=int, default=0, metavar="N", help="run on a real-shapes slice of the real model's first N "
                    "layers (solar_open2.checkpoint.make_slice, drawn on the GPU: about 9.1 GB at N = 2) instead of the tiny "
                    "checkpoints, with token-id prompts of 5 to 4,096 tokens; default 0: the tiny checkpoints")
    ap.add_argument("--slice-rank", action="store_true", help="with --slice: cut the slice from one TP2 rank of the real "
                    "model (budget.rank_config, served at TP1), so the kernels whose tables name only the rank's shapes "
                    "(the GEMV pairs) are given and must launch")
    ap.add_argument("--long", action="store_true", help="prompts of 700 and 4,096 tokens (long_prompts) instead of the "
                    "short ones: the float32 tail at long prompts (pair with --cases bf16:eager:float32)")
    ap.add_argument("--additional-config", help="JSON object passed to vLLM as additional_config in every run, "
                    "e.g. '{\"solar_open2_fuse_kda_proj\": true}'")
    a = ap.parse_args(argv)
    a.ac = {}                                                            # --additional-config, parsed once
    if a.additional_config is not None:
        try: a.ac = json.loads(a.additional_config)
        except json.JSONDecodeError as e: ap.error(f"--additional-config: not JSON ({e})")
        if not isinstance(a.ac, dict): ap.error(f"--additional-config: expected a JSON object, got {a.additional_config!r}")
    if a.slice:
        from solar_open2.checkpoint import slice_config
        try: slice_config(a.slice)
        except ValueError as e: ap.error(f"--slice {a.slice}: {e}")
    if a.slice_rank and not a.slice: ap.error("--slice-rank: needs --slice N (it says which slice to cut)")
    if a.child_model: return child_main(a)
    if a.rejudge: return rejudge(a)
    if a.merge: return merge(a)
    cases = []
    for c in a.cases or (SLICE_CASES if a.slice else DEFAULT_CASES):
        fmt, mode, dtype = (c.split(":") + ["bfloat16"])[:3]
        if fmt not in ("compressed-tensors", "modelopt", "bf16") or mode not in MODES or dtype not in ("bfloat16", "float32"):
            ap.error(f"--cases: bad case {c!r}")
        if fmt != "bf16" and dtype == "float32": ap.error(f"--cases {c}: NVFP4 experts run through Marlin, which needs bf16/fp16")
        cases.append((fmt, mode, dtype))

    import torch
    t_start = time.time()
    if not torch.cuda.is_available():
        print("gpu_parity: no CUDA device", file=sys.stderr); return 2
    from solar_open2.checkpoint import make_slice, make_tiny, trained_file
    if a.slice: a.weights = "random"                                    # random weights of the real shapes: no behaviour tasks                                            # random weights of the real shapes: no behaviour tasks
    if a.weights != "random":
        try: w_file, w_sha = trained_file(a.weights)
        except (OSError, ValueError) as e: ap.error(f"--weights: {e}")
    work = Path(a.workdir or tempfile.mkdtemp(prefix="solar_parity_"))
    installed = plugin_entry_point()
    paths = [str(ROOT)] + ([] if installed else [str(entry_point_shim(work / "shim"))])
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    import vllm
    report = {"command": command_line(), "gpu": torch.cuda.get_device_name(0),
              "git_commit": git_commit(ROOT), "git_dirty": git_dirty(ROOT), "source_sha256": source_digest(ROOT),
              "additional_config": a.ac, "moe_backend": a.moe_backend, "gemv_probe": a.gemv_probe,
              "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version()},
              "plugin_entry_point": "installed" if installed else "shim dist-info on PYTHONPATH", "tokens": a.tokens,
              "logprob_tol": a.logprob_tol, "logprob_mean_tol": a.logprob_mean_tol, "noise_factor": a.noise_factor, "tie_nats": a.tie_nats,
              "weights": "random" if a.weights == "random" else {"arg": a.weights, "file": str(w_file), "sha256": w_sha},
              "slice_layers": a.slice, "slice_rank": a.slice_rank, "long_prompts": a.long,
              "min_recall": a.min_recall, "min_facts": a.min_facts, "behaviour_drop": a.behaviour_drop, "traps": a.traps, "runs": {}, "failures": [],
              "reference_behaviour": {}}
    ps = prompts_for(a.weights, a.slice, a.long, a.slice_rank); refs = {}; done = {}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for fmt, mode, dtype in cases:
        case = f"{fmt}:{mode}:{dtype}"
        if time.time() - t_start > a.deadline_s:
            report["failures"].append(f"{case}: not run (deadline)"); continue
        ck = work / f"{('slice_rank' if a.slice_rank else 'slice') if a.slice else 'tiny'}_{fmt.replace('-', '_')}"
        if not (ck / "config.json").exists():
            t_ck = time.time()
            if a.slice: make_slice(ck, a.slice, format=fmt, device="cuda", base=slice_base(a.slice_rank))
            else: make_tiny(ck, format=fmt, weights=a.weights)
            report.setdefault("checkpoint_s", {})[fmt] = round(time.time() - t_ck, 1)
        outf = work / f"vllm_{fmt}_{mode}_{dtype}.json"
        t = time.time()
        logf = Path(a.out) / f"{a.name}_{fmt}_{mode}_{dtype}.log"              # streamed: a hung or killed engine leaves its log
        rc = run_logged([sys.executable, "-m", MODULE, "--child-model", str(ck), "--child-mode", mode, "--child-dtype", dtype,
                         "--child-out", str(outf), "--tokens", str(a.tokens)]
                        + (["--additional-config", a.additional_config] if a.additional_config else [])
                        + (["--gemv-probe"] if a.gemv_probe else [])
                        + ["--gpu-memory-utilization", str(a.gpu_memory_utilization)]
                        + (["--kv-cache-memory-bytes", str(a.kv_cache_memory_bytes)] if a.kv_cache_memory_bytes else [])
                        + ["--moe-backend", a.moe_backend, "--weights", a.weights, "--slice", str(a.slice)]
                        + (["--slice-rank"] if a.slice_rank else [])
                        + (["--long"] if a.long else []) + (["--traps"] if a.traps else []),
                        logf, child_timeout(a.deadline_s, time.time() - t_start), env, ROOT)
        if rc != 0:
            report["failures"].append(f"{case}: vLLM run failed (rc {rc}): {logf.read_text(errors='replace')[-800:]}")
            continue
        res = json.loads(outf.read_text()); res["wall_s"] = round(time.time() - t, 1)
        try:
            if fmt not in refs: refs[fmt] = (load_reference(ck, "cuda", "float32", not a.slice), load_reference(ck, "cuda", "bfloat16", not a.slice))
        except Exception as e:
            report["failures"].append(f"{fmt}: reference model failed to load: {type(e).__name__}: {e}"); continue
        m32, m16 = refs[fmt]
        if res.get("behaviour") and fmt not in report["reference_behaviour"]:
            report["reference_behaviour"][fmt] = behaviour_reference(m32)
        m16_ = m16 if dtype == "bfloat16" else None
        single = [compare(m32, p, g, "cuda", a.tie_nats, m16_) for p, g in zip(ps, res["single"])]
        batched = [compare(m32, p, g, "cuda", a.tie_nats, m16_) for p, g in zip(ps, res["batched"])]
        same_batched = [g["tokens"] == b["tokens"] for g, b in zip(res["single"], res["batched"])]
        rec = {k: res.get(k) for k in ("init_s", "single_s", "wall_s", "block_size", "cudagraph_mode", "dtype", "additional_config", "moe_backend",
                                       "architecture", "launches", "max_model_len", "triton_f32_default")}
        rec.update({"kda_op_splits_graphs": "vllm::solar_open2_kda_attention" in (res["splitting_ops"] or []),
                    "single": single, "batched": batched, "batched_equals_single": same_batched,
                    "tokens": [g["tokens"] for g in res["single"]]})
        if res.get("behaviour"):
            rec["behaviour"] = behaviour_scores(res["behaviour"])
            rec["behaviour_reference"] = report["reference_behaviour"][fmt]
        if res.get("behaviour_traps"):
            rec["behaviour_traps"] = {n: {"layers": t["layers"], "scores": behaviour_scores(t["outputs"])} for n, t in res["behaviour_traps"].items()}
        elif a.traps and mode == "eager" and a.weights != "random":
            report["failures"].append(f"{case}: --traps: the engine ran no trap")
        report["failures"] += judge_run(case, rec, a)
        if mode == "graphs" and not rec["kda_op_splits_graphs"]:
            report["failures"].append(f"{case}: the KDA op is not among the CUDA-graph splitting ops")
        report["runs"][case] = rec; done[case] = res
        for (f2, m2, d2), other in [(tuple(k.split(":")), v) for k, v in done.items()]:
            if f2 == fmt and d2 == dtype and m2 != mode:
                e_, g_ = (other, res) if m2 == "eager" else (res, other)
                same = [x["tokens"] == y["tokens"] for x, y in zip(e_["single"], g_["single"])]
                d = max(abs(u - v) for x, y in zip(e_["single"], g_["single"]) for u, v in zip(x["logprobs"], y["logprobs"]))
                dk = [abs(p[j] - q[j]) for x, y in zip(e_["single"], g_["single"]) for p, q in zip(x["topk"], y["topk"])
                      for j in p if j in q]
                key = f"{fmt}:{dtype}:eager_vs_graphs"
                report["runs"][key] = {"same_tokens": same, "max_abs_dlogprob": d,
                                       "topk_max_abs_dlogprob": max(dk), "topk_mean_abs_dlogprob": sum(dk) / len(dk),
                                       "divergences": mode_divergences(report["runs"][f"{fmt}:eager:{dtype}"],
                                                                       report["runs"][f"{fmt}:graphs:{dtype}"], dtype)}
                report["failures"] += judge_run(key, report["runs"][key], a)
        (Path(a.out) / f"{a.name}.json").write_text(json.dumps(report, indent=1) + "\n")   # partial results survive a kill
    report["wall_s"] = round(time.time() - t_start, 1)
    report["passed"] = not report["failures"]
    (Path(a.out) / f"{a.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    summary = {}
    for case, r in report["runs"].items():
        if "single" not in r: summary[case] = r; continue
        summary[case] = {"init_s": r["init_s"], "mismatches": sum(len(c["mismatches"]) for c in r["single"]),
                         "near_ties": sum(len(c["near_ties"]) for c in r["single"]),
                         "bf16_flips": sum(len(c.get("bf16_flips", [])) for c in r["single"]),
                         "max_dlogprob": round(max(c["max_abs_dlogprob"] for c in r["single"]), 4),
                         "mean_dlogprob": round(sum(c["mean_abs_dlogprob"] for c in r["single"]) / len(r["single"]), 4),
                         "min_top2_margin": round(min(c["min_top2_margin"] for c in r["single"]), 3)}
        if r.get("behaviour"): summary[case]["behaviour"] = {t: round(v, 3) for t, v in r["behaviour"].items()}
        if "topk_mean_abs_dlogprob" in r["single"][0]:
            summary[case]["topk_max_dlogprob"] = round(max(c["topk_max_abs_dlogprob"] for c in r["single"]), 4)
            summary[case]["topk_mean_dlogprob"] = round(sum(c["topk_mean_abs_dlogprob"] for c in r["single"]) / len(r["single"]), 4)
        if "noise_floor_bf16_reference" in r["single"][0]:
            nf = [c["noise_floor_bf16_reference"] for c in r["single"]]
            summary[case]["bf16_reference_noise"] = {"mismatches": sum(x["mismatches"] for x in nf),
                                                     "mean_dlogprob": round(sum(x["mean_abs_dlogprob"] for x in nf) / len(nf), 4),
                                                     "topk_mean_dlogprob": round(sum(x.get("topk_mean_abs_dlogprob", 0) for x in nf) / len(nf), 4)}
    print(json.dumps({"passed": report["passed"], "summary": summary, "failures": report["failures"]}, indent=1))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
