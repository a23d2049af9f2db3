"""Speculative decoding through the plugin on the GPU: greedy output with drafts equals greedy output without.

    python -m benchmarks.engine.spec [--formats compressed-tensors bf16] [--modes eager graphs] [--ks 1 3 5]
                                     [--draft eagle3] [--tokens 64] [--lanes 4] [--weights trained|random|FILE]
                                     [--out DIR] [--name gpu_spec] [--deadline-s 540]

Any draft, however bad, must leave greedy output unchanged: the target verifies every proposed token and keeps the
longest prefix equal to its own argmax, plus its own next token. So for each tiny checkpoint (`make_tiny`: the NVFP4
compressed-tensors build and its BF16 twin) and each mode (`eager`; `graphs`: torch.compile with piecewise and full
CUDA graphs) one engine runs without speculation (the baseline) and one per speculative setting: vLLM's ngram
proposer with k draft tokens (`--ks`), and with `--draft eagle3` an EAGLE-3 head of random weights shaped like the
published Solar draft (`sionic-ai/Solar-Open2-250B-ultrafast-Draft-LM-head`: five taps of the target's hidden states,
a 7-token block), scaled to the tiny model (`write_eagle3_draft`). Each engine generates `--tokens` greedy tokens for
the five prompts of `benchmarks.engine.parity` (chat facts, a sentence, a recall query, a copy, the corpus), one at a
time and as one batch, and reads vLLM's speculative-decoding counters (drafts, draft tokens, accepted tokens, per
position) around each call.

Checks (each a failure line in the JSON; `GATE_RULE`): every run's tokens are the fp32 reference's argmax on its own
sequence (teacher-forced, as in `benchmarks.engine.parity`), near-ties apart (the reference's top-2 within
`--tie-nats`); every speculative run's tokens equal the baseline's of the same checkpoint and mode, alone and batched,
or first leave them at a near-tie (bf16 rounding of a verify and of a one-token step may pick either token there, as
eager and CUDA graphs may); its counters show drafts and at least one rejection (acceptance < 100 %: a run that
accepted everything did not exercise the rollback). Reported per run: acceptance rate (accepted / draft tokens), mean
accepted length (1 + accepted / drafts: the tokens one verify step yields), the per-position acceptance, engine init
time, and whether the KDA op split the CUDA graphs. `--rejudge JSON` re-applies the checks to a saved report on any
machine (the reference runs on the CPU when there is no GPU).

Engines run `--lanes` at a time on the one GPU, each with a fixed 1 GiB KV pool (`kv_cache_memory_bytes`: vLLM then
skips its memory profiling, which the other engines' allocations would upset). The plugin reaches every vLLM
process as in the parity script (installed entry point, or a throw-away dist-info on PYTHONPATH). Writes `<name>.json`
and one log per engine to --out (default $OUT, else benchmarks/results/incoming/); exits 1 if any check fails.
"""
import argparse, json, os, platform, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from benchmarks.common import INCOMING, ROOT, child_timeout, command_line, git_commit, git_dirty, run_logged, source_digest
from benchmarks.engine.parity import BF16_TIE_ULPS, ENV, entry_point_shim, load_reference, plugin_entry_point, prompts_for

MODULE = "benchmarks.engine.spec"
FORMATS = ("compressed-tensors", "bf16")
MODES = ("eager", "graphs")
# the published Solar draft head: taps entering layers 3, 15, 27, 39, 47 of 48, a block of 7 draft tokens
PUBLISHED_TAPS, PUBLISHED_LAYERS, PUBLISHED_BLOCK = (3, 15, 27, 39, 47), 48, 7
KV_BYTES = 1 << 30
NORM_PROBE_ENV = "SOLAR_OPEN2_NORM_PROBE"   # solar_open2.vllm.model's (not imported here: that module needs vLLM)


def scaled_taps(num_layers: int, taps=PUBLISHED_TAPS, of: int = PUBLISHED_LAYERS) -> list:
    "The published head's tap layers at the same relative depths of a `num_layers`-layer target (distinct, in range)."
    out = []
    for t in taps:
        x = min(num_layers - 1, max(0, round(t * num_layers / of)))
        while x in out and x + 1 < num_layers: x += 1
        out.append(x)
    if len(set(out)) != len(out): raise ValueError(f"scaled_taps: {len(taps)} taps do not fit {num_layers} layers")
    return out


def write_eagle3_draft(dest, target_cfg, taps: list, seed: int = 0, std: float = 0.02, draft_vocab: int | None = None) -> dict:
    """An EAGLE-3 draft head for `target_cfg` (a `SolarOpen2Config`) in `dest`: one Llama decoder layer whose fc reads
    `len(taps)` target hidden states (vLLM's `LlamaForCausalLMEagle3`), random N(0, std^2) matrices and unit norms in
    bf16, its own embedding, and an LM head over the target's vocabulary or, with `draft_vocab`, over its first
    `draft_vocab` token ids (vLLM's `d2t` offsets, all 0), which keeps the head's own cost small at the real vocabulary.
    Returns the config written."""
    import torch
    from safetensors.torch import save_file
    dest = Path(dest); dest.mkdir(parents=True, exist_ok=True)
    H, V, n = target_cfg.hidden_size, target_cfg.vocab_size, len(taps)
    Vd = V if draft_vocab is None else int(draft_vocab)
    if not 0 < Vd <= V: raise ValueError(f"draft_vocab {draft_vocab}: must be in 1..{V} (the target's vocabulary)")
    heads, kv, hd, inter = 4, 2, H // 4, 2 * H
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H, "intermediate_size": inter,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "num_hidden_layers": 1, "vocab_size": V,
           "draft_vocab_size": Vd, "target_hidden_size": H, "max_position_embeddings": target_cfg.max_position_embeddings,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(taps), "use_aux_hidden_state": True}}
    g = torch.Generator().manual_seed(seed)
    mat = lambda *s: (torch.randn(*s, generator=g) * std).to(torch.bfloat16)
    one = lambda m: torch.ones(m, dtype=torch.bfloat16)
    W = {"embed_tokens.weight": mat(V, H), "lm_head.weight": mat(Vd, H), "fc.weight": mat(H, n * H), "norm.weight": one(H),
         "layers.0.self_attn.q_proj.weight": mat(heads * hd, 2 * H), "layers.0.self_attn.k_proj.weight": mat(kv * hd, 2 * H),
         "layers.0.self_attn.v_proj.weight": mat(kv * hd, 2 * H), "layers.0.self_attn.o_proj.weight": mat(H, heads * hd),
         "layers.0.mlp.gate_proj.weight": mat(inter, H), "layers.0.mlp.up_proj.weight": mat(inter, H),
         "layers.0.mlp.down_proj.weight": mat(H, inter), "layers.0.input_layernorm.weight": one(H),
         "layers.0.hidden_norm.weight": one(H), "layers.0.post_attention_layernorm.weight": one(H)}
    if Vd != V: W["d2t"] = torch.zeros(Vd, dtype=torch.int64)                 # draft id i -> target id i + d2t[i]
    save_file(W, str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return cfg


def spec_metrics(llm) -> dict:
    "vLLM's speculative-decoding counters now (0 where absent): drafts, draft tokens, accepted tokens, accepted per position."
    out = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_pos": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    for m in llm.get_metrics():
        if m.name in names: out[names[m.name]] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            v = list(m.values); acc = out["accepted_per_pos"]
            out["accepted_per_pos"] = [a + b for a, b in zip(acc + [0] * (len(v) - len(acc)), v)]
    return out


def delta(a: dict, b: dict) -> dict:
    "Counters of `b` minus those of `a`, with the acceptance rate and the mean accepted length (tokens per verify)."
    d = {k: b[k] - a[k] for k in ("drafts", "draft_tokens", "accepted_tokens")}
    pa = a["accepted_per_pos"] + [0] * (len(b["accepted_per_pos"]) - len(a["accepted_per_pos"]))
    d["accepted_per_pos"] = [y - x for x, y in zip(pa, b["accepted_per_pos"])]
    d["acceptance"] = d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else None
    d["mean_accepted_length"] = 1 + d["accepted_tokens"] / d["drafts"] if d["drafts"] else None
    return d


# ---- child: one engine ---------------------------------------------------------------------------------------------

def run_engine(model_dir: str, mode: str, n_tokens: int, spec: dict | None, weights: str, kv_bytes: int = KV_BYTES,
               cudagraph_mode: str | None = None, norm_probe: bool = False, options: dict | None = None) -> dict:
    """Greedy generation of every prompt alone and as one batch, with `spec` as vLLM's speculative_config (None: off);
    `cudagraph_mode` (graphs mode): vLLM's, e.g. PIECEWISE (default: the plugin's, PIECEWISE with speculation); a full
    mode with `spec` also sets the plugin's option `spec_full_graphs`, which keeps it; `options`: more plugin options
    (e.g. `spec_pad_drafts`: ngram drafts padded to k, so every decode step replays the full graph). `norm_probe`: the model watches
    every layer's output (`SOLAR_OPEN2_NORM_PROBE`, set by the parent), and the tables of the single and the batched
    calls are returned apart (`norms_single`, `norms_batched`; reset after start-up and between the two)."""
    if not plugin_entry_point(): raise RuntimeError("the solar_open2 vllm.general_plugins entry point is not visible")
    from vllm import LLM, SamplingParams
    kw = dict(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype="bfloat16", seed=0, max_model_len=1024,
              max_num_seqs=8, gpu_memory_utilization=0.08, kv_cache_memory_bytes=kv_bytes, enable_prefix_caching=False,
              disable_log_stats=False)
    if spec: kw["speculative_config"] = spec
    full = bool(spec and cudagraph_mode and "FULL" in cudagraph_mode)       # the plugin would make it PIECEWISE (spec_graphs_guard)
    if full or options: kw["additional_config"] = {"solar_open2": {**({"spec_full_graphs": True} if full else {}), **(options or {})}}
    kw["worker_extension_cls"] = "solar_open2.vllm.model.LaunchProbe"       # the launch record, and the norm probe's tables
    if mode == "eager": kw["enforce_eager"] = True
    else: kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64],
                                      **({"cudagraph_mode": cudagraph_mode} if cudagraph_mode else {})}
    t0 = time.perf_counter()
    llm = LLM(**kw)
    init_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True, detokenize=False)
    gen = lambda ps: [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in ps], sp, use_tqdm=False)]
    ps = prompts_for(weights)
    norms = lambda: llm.collective_rpc("solar_norms", kwargs={"reset": True})[0] if norm_probe else None
    norms()                                                                    # start-up's calls (profiling, capture) apart
    m0 = spec_metrics(llm); t = time.perf_counter()
    single = [gen([p])[0] for p in ps]
    single_s = time.perf_counter() - t; m1 = spec_metrics(llm)
    n_single = norms()
    batched = gen(ps)
    m2 = spec_metrics(llm)
    n_batched = norms()
    cfg = llm.llm_engine.vllm_config
    probe = llm.collective_rpc("solar_launches")[0]                            # apply's record and the launch counts
    return {"init_s": round(init_s, 1), "single_s": round(single_s, 2), "single": single, "batched": batched,
            "applied": probe["applied"], "launches": probe["launches"],
            "spec_single": delta(m0, m1), "spec_batched": delta(m1, m2),
            "splitting_ops": cfg.compilation_config.splitting_ops, "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode),
            "speculative_config": str(cfg.speculative_config) if cfg.speculative_config else None,
            **({"norms_single": n_single, "norms_batched": n_batched} if norm_probe else {})}


def child_main(a) -> int:
    res = run_engine(a.child_model, a.child_mode, a.tokens, json.loads(a.child_spec) if a.child_spec else None, a.weights,
                     cudagraph_mode=a.child_cudagraph_mode, norm_probe=a.norm_probe,
                     options=json.loads(a.child_options) if a.child_options else None)
    Path(a.child_out).write_text(json.dumps(res))
    return 0


# ---- parent ----------------------------------------------------------------------------------------------------------

def ngram_config(k: int, method: str = "ngram") -> dict:
    """vLLM's speculative_config for ngram with up to `k` draft tokens a step, as `solar-open2 scripts --ngram` serves it
    (`serving.ngram_spec`), by `method`: one of the proposers `spec_pad_drafts` pads (`ngram`: on the host; `ngram_gpu`: on
    the GPU, where vLLM keeps asynchronous scheduling)."""
    from solar_open2.serving import ngram_spec
    from solar_open2.vllm.config import PADDED_PROPOSERS
    if method not in PADDED_PROPOSERS: raise ValueError(f"ngram_config: method {method!r} is not one of {PADDED_PROPOSERS}")
    return ngram_spec(k, method)


def plan(formats, modes, ks, draft: str | None, draft_dir: Path | None, only: list | None = None) -> list:
    """(format, mode, name, speculative_config or None, cudagraph_mode or None, plugin options or None) of every engine,
    baselines first. In
    graphs mode the plugin asks for piecewise graphs when speculation is on (`spec_graphs_guard`); the draft head also
    runs with full graphs asked for explicitly (`eagle3_dummy_full`, and with 3 draft tokens `eagle3_k3_full`, through the
    option `spec_full_graphs`), the mode that was wrong batched in runs 1-3 and hit an illegal memory access in the probe
    run, only where a batch is padded to a capture size; `ngram_k3_full` asks for the same graphs with no draft model,
    which tells the target's verify from the drafter, and `ngram_k3_pad` the same with the option `spec_pad_drafts`
    (every decode step a verify of 1 + 3 tokens a request); `ngram_gpu_k3_pad` pads vLLM's GPU proposer the same way, with
    asynchronous scheduling on (as for the EAGLE-3 head, and unlike `ngram`), so a wrong batched full-graph verify
    there and not in `ngram_k3_pad` points at the scheduling; `ngram_gpu_k3_pad_nosync` adds the option
    `spec_skip_draft_sync` (every row padded, no wait for the previous step's draft counts far from the length limit). Every ngram run verifies through the plugin's defaults,
    the fused KDA verify (option `kda_verify_kernel`) included; the gate checks that it launched. `only`: keep the runs whose `FORMAT:MODE:NAME` key is listed
    (and their baselines)."""
    runs = [(f, m, "base", None, None, None) for f in formats for m in modes]
    for f in formats:
        for m in modes:
            runs += [(f, m, f"ngram_k{k}", ngram_config(k), None, None) for k in ks]
            if m == "graphs":                                                  # the full-graph fault without a draft model:
                runs.append((f, m, "ngram_k3_full", ngram_config(3), "FULL_AND_PIECEWISE", None))   # the target's verify, or the drafter?
                runs.append((f, m, "ngram_k3_pad", ngram_config(3), "FULL_AND_PIECEWISE", {"spec_pad_drafts": True}))   # every step a verify
                runs.append((f, m, "ngram_gpu_k3_pad", ngram_config(3, "ngram_gpu"), "FULL_AND_PIECEWISE",
                             {"spec_pad_drafts": True}))                       # the same, asynchronous scheduling on
                runs.append((f, m, "ngram_gpu_k3_pad_nosync", ngram_config(3, "ngram_gpu"), "FULL_AND_PIECEWISE",
                             {"spec_pad_drafts": True, "spec_skip_draft_sync": True}))   # and no wait for the draft counts
            if draft == "eagle3":
                eagle = lambda k: {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": k}
                runs.append((f, m, "eagle3_dummy", eagle(PUBLISHED_BLOCK), None, None))
                if m == "graphs":
                    runs += [(f, m, "eagle3_dummy_full", eagle(PUBLISHED_BLOCK), "FULL_AND_PIECEWISE", None),
                             (f, m, "eagle3_k3_full", eagle(3), "FULL_AND_PIECEWISE", None)]
    if only:
        keep = {k for k in only} | {":".join(k.split(":")[:2] + ["base"]) for k in only}
        runs = [r for r in runs if ":".join(r[:3]) in keep]
    return runs


def explain(m, prompt: list, tokens: list, base: list | None, tie_nats: float, device: str = "cuda") -> dict:
    """One run's tokens for one prompt against the fp32 reference `m` (teacher-forced on the run's own sequence): the
    positions whose token is not the reference's argmax (`mismatches`; `near_ties` where the argmax leads by less than
    `tie_nats` or by less than `parity.BF16_TIE_ULPS` bf16 ulps of its logit: every engine here computes in bf16), and where the run first leaves the non-speculative run's `base` tokens, the reference's log-probs of the
    two tokens there (same prefix up to that position)."""
    import torch
    from benchmarks.engine.parity import bf16_tie, bf16_ulp, compare_lp, reference_logits
    n = len(tokens)
    logits = reference_logits(m, prompt + tokens, device)[len(prompt) - 1: len(prompt) - 1 + n]   # [n, V]
    lp = torch.log_softmax(logits, -1)                                                     # [n, V]
    c = compare_lp(lp, tokens, [0.0] * n, tie_nats, logits=logits)
    bf16_ties = [j for j in c["mismatches"] if bf16_tie(c, j)]                             # the engines' logits are bf16
    out = {"mismatches": [j for j in c["mismatches"] if j not in bf16_ties], "near_ties": c["near_ties"] + bf16_ties,
           "divergence": None}
    if base is not None and base != tokens:
        j = next(t for t, (x, y) in enumerate(zip(tokens, base)) if x != y)
        gap = abs(float(lp[j, tokens[j]] - lp[j, base[j]]))
        out["divergence"] = {"position": j, "token": tokens[j], "base_token": base[j], "logprob": float(lp[j, tokens[j]]),
                             "base_logprob": float(lp[j, base[j]]), "gap_nats": gap, "gap_ulps": round(gap / bf16_ulp(float(logits[j].max())), 3),
                             "argmax": int(torch.argmax(lp[j]))}
    return out


def add_reference(report: dict, work: Path, formats, weights: str, tie_nats: float, device: str) -> None:
    "Every run of `report` against the fp32 reference of its checkpoint (`explain`), into `run['reference']`."
    from solar_open2.checkpoint import make_tiny
    ps = prompts_for(weights)
    for fmt in formats:
        ck = work / f"tiny_{fmt.replace('-', '_')}"
        if not (ck / "config.json").exists(): make_tiny(ck, format=fmt, weights=weights)
        m = load_reference(ck, device, "float32")
        for key, r in report["runs"].items():
            if not key.startswith(fmt + ":") or "error" in r: continue
            base = report["runs"].get(":".join(key.split(":")[:2] + ["base"]))
            r["reference"] = {part: [explain(m, p, toks, (base or {}).get(part, [None] * len(ps))[i], tie_nats, device)
                                     for i, (p, toks) in enumerate(zip(ps, r[part]))] for part in ("single", "batched")}
        del m


def rejudge(a) -> int:
    "Re-apply the reference comparison and the checks to a saved report (`--rejudge`), on the GPU if there is one."
    import torch
    rep = json.loads(Path(a.rejudge).read_text())
    rep["rejudged_from"] = {"file": Path(a.rejudge).name, "failures_at_run": rep.get("failures", [])}
    fmts = sorted({k.split(":")[0] for k in rep["runs"]})
    work = Path(a.workdir or tempfile.mkdtemp(prefix="solar_spec_"))
    add_reference(rep, work, fmts, rep.get("weights", "trained"), a.tie_nats, "cuda" if torch.cuda.is_available() else "cpu")
    rep["tie_nats"], rep["gate_rule"] = a.tie_nats, GATE_RULE
    rep["failures"] = judge(rep); rep["passed"] = not rep["failures"]
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"{a.name}.json").write_text(json.dumps(rep, indent=1) + "\n")
    print(json.dumps({"passed": rep["passed"], "failures": rep["failures"]}, indent=1))
    return 0 if rep["passed"] else 1


GATE_RULE = ("a speculative run passes when, for every prompt, alone and batched, its tokens equal the non-speculative "
             "run's, or first leave them at a near-tie (the fp32 reference's log-probs of the two tokens within tie_nats, or "
             "within parity.BF16_TIE_ULPS bf16 ulps of the top logit: "
             "bf16 rounding of a verify and of a one-token step may pick either, as eager and CUDA graphs may), and every "
             "token it chose is the reference's argmax on its own sequence but at near-ties; and it proposed drafts and "
             "rejected at least one; and where the plugin gave its layers the KDA verify kernel, the kernel launched")


def norm_findings(runs: dict, factor: float = 4.0) -> dict:
    """Per run with probe tables (`--norm-probe`) and part (single, batched): the lowest row (0 the embeddings, i layer i's
    output) with a non-finite value and the call that first saw one, and the rows whose largest finite |h| or |residual|
    is more than `factor` times, or less than 1/`factor` of, the same part's row in the baseline of its checkpoint and
    mode (`outsized`, `undersized`: a layer whose output is finite but wrong in size)."""
    out = {}
    for key, r in runs.items():
        for part in ("single", "batched"):
            t = r.get(f"norms_{part}")
            if not t: continue
            cols = t["cols"]; ci = {c: cols.index(c) for c in cols}
            bad = [i for i, row in enumerate(t["rows"]) if row[ci["h_nonfinite"]] + row[ci["residual_nonfinite"]] > 0]
            f = {"first_nonfinite_row": bad[0] if bad else None,
                 "first_bad_call": t["rows"][bad[0]][ci["first_bad_call"]] if bad else None,
                 "nonfinite_rows": bad, "outsized": [], "undersized": []}
            base = (runs.get(":".join(key.split(":")[:2] + ["base"])) or {}).get(f"norms_{part}")
            if base and key.split(":")[2] != "base":
                for i, (row, b) in enumerate(zip(t["rows"], base["rows"])):
                    for c in ("h_absmax", "residual_absmax"):
                        x, y = row[ci[c]], b[ci[c]]
                        if y > 0 and x > factor * y: f["outsized"].append([i, c, round(x / y, 2)])
                        elif y > 0 and x < y / factor: f["undersized"].append([i, c, round(x / y, 4)])
            out[f"{key}:{part}"] = f
    return out


def judge(report: dict) -> list:
    "Failure lines of a report (GATE_RULE): divergences that are not near-ties, tokens off the reference, no drafts, no rejection, a verify kernel that never ran."
    from solar_open2.vllm.model import launch_problems
    fails, runs = [], report["runs"]
    for key, r in runs.items():
        fmt, mode, name = key.split(":")
        if "error" in r: fails.append(f"{key}: engine failed: {r['error'][-600:]}"); continue
        for part in ("single", "batched"):
            for i, e in enumerate((r.get("reference") or {}).get(part, [])):
                if e["mismatches"]: fails.append(f"{key}: {part} prompt {i}: tokens off the fp32 reference's argmax at {e['mismatches']}")
                d = e["divergence"]
                if d and d["gap_nats"] >= report.get("tie_nats", 0.05) and d.get("gap_ulps", BF16_TIE_ULPS) >= BF16_TIE_ULPS:
                    fails.append(f"{key}: {part} prompt {i}: leaves the non-speculative tokens at {d['position']} "
                                 f"({d['token']} for {d['base_token']}), {d['gap_nats']:.3f} nats apart: not a near-tie")
        # a kernel given and never run was not tested; of the plugin's kernels only the verify kernel runs in a
        # speculative engine (the one-token decode kernels are given but step aside for the op body there)
        fails += [f"{key}: {p}" for p in launch_problems({"kda_verify_kernel": (r.get("applied") or {}).get("kda_verify_kernel")},
                                                          r.get("launches") or {})]
        if name == "base": continue
        if not runs.get(f"{fmt}:{mode}:base") or "error" in runs[f"{fmt}:{mode}:base"]:
            fails.append(f"{key}: no baseline to compare with"); continue
        drafts = r["spec_single"]["draft_tokens"] + r["spec_batched"]["draft_tokens"]
        acc = r["spec_single"]["accepted_tokens"] + r["spec_batched"]["accepted_tokens"]
        if drafts == 0: fails.append(f"{key}: no draft tokens were proposed: speculation did not run")
        elif acc >= drafts: fails.append(f"{key}: every draft token was accepted ({acc}/{drafts}): no rollback exercised")
    return fails


def child_command(a, ck: Path, mode: str, outf: Path, spec: dict | None, cg: str | None, options: dict | None = None) -> list:
    "The command of one engine's child process, from the parent's arguments `a` (`--norm-probe` passed on)."
    return ([sys.executable, "-m", MODULE, "--child-model", str(ck), "--child-mode", mode, "--child-out", str(outf),
             "--tokens", str(a.tokens), "--weights", a.weights] + (["--norm-probe"] if a.norm_probe else [])
            + (["--child-options", json.dumps(options)] if options else [])
            + (["--child-spec", json.dumps(spec)] if spec else []) + (["--child-cudagraph-mode", cg] if cg else []))


def child_env(a, paths: list) -> dict:
    "The children's environment: this one, parity's `ENV`, `paths` first on PYTHONPATH, and the probe's variable with `--norm-probe`."
    return {**os.environ, **ENV, **({NORM_PROBE_ENV: "1"} if a.norm_probe else {}),
            "PYTHONPATH": os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 3, 5], help="ngram draft tokens per step, one engine each")
    ap.add_argument("--draft", choices=("none", "eagle3"), default="eagle3", help="also run a random-weight draft head (default eagle3)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--lanes", type=int, default=4, help="engines at once on the GPU")
    ap.add_argument("--weights", default="trained", metavar="{trained,random,FILE}")
    ap.add_argument("--tie-nats", type=float, default=0.05)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(INCOMING))
    ap.add_argument("--name", default="gpu_spec")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--deadline-s", type=float, default=540, help="stop starting engines after this many seconds")
    ap.add_argument("--rejudge", metavar="JSON", help="re-apply the reference comparison and the checks to a saved report")
    ap.add_argument("--only", nargs="+", metavar="FORMAT:MODE:NAME", help="run only these engines (and their baselines)")
    ap.add_argument("--child-model"); ap.add_argument("--child-mode"); ap.add_argument("--child-out"); ap.add_argument("--child-spec")
    ap.add_argument("--norm-probe", action="store_true",
                    help="every engine watches each layer's output (SOLAR_OPEN2_NORM_PROBE); the report says, per run and part, "
                         "the first layer output with a non-finite value and the rows far from the baseline's (norm_findings)")
    ap.add_argument("--child-cudagraph-mode"); ap.add_argument("--child-options", help="more plugin options, as JSON")
    a = ap.parse_args(argv)
    if any(k < 1 for k in a.ks): ap.error(f"--ks: draft token counts must be >= 1, got {a.ks}")
    if a.child_model: return child_main(a)
    if a.rejudge: return rejudge(a)
    import torch
    if not torch.cuda.is_available(): print("gpu_spec: no CUDA device", file=sys.stderr); return 2
    from solar_open2.checkpoint import make_tiny
    from solar_open2.config import SolarOpen2Config
    t_start = time.time()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="solar_spec_"))
    installed = plugin_entry_point()
    paths = [str(ROOT)] + ([] if installed else [str(entry_point_shim(work / "shim"))])
    env = child_env(a, paths)
    taps = scaled_taps(SolarOpen2Config.tiny().num_hidden_layers)
    draft_dir = work / "eagle3_draft"
    if a.draft == "eagle3": write_eagle3_draft(draft_dir, SolarOpen2Config.tiny(), taps)
    for f in a.formats:
        ck = work / f"tiny_{f.replace('-', '_')}"
        if not (ck / "config.json").exists(): make_tiny(ck, format=f, weights=a.weights)
    import vllm
    report = {"command": command_line(), "gpu": torch.cuda.get_device_name(0), "git_commit": git_commit(ROOT),
              "git_dirty": git_dirty(ROOT), "source_sha256": source_digest(ROOT),
              "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version()},
              "weights": a.weights, "tokens": a.tokens, "ks": a.ks, "lanes": a.lanes, "kv_cache_memory_bytes": KV_BYTES,
              "draft": None if a.draft == "none" else {"method": a.draft, "taps": taps, "block": PUBLISHED_BLOCK,
                                                       "published": {"taps": list(PUBLISHED_TAPS), "layers": PUBLISHED_LAYERS}},
              "gate_rule": GATE_RULE, "runs": {}, "failures": []}
    Path(a.out).mkdir(parents=True, exist_ok=True)

    def one(run):
        fmt, mode, name, spec, cg, opts = run
        key = f"{fmt}:{mode}:{name}"
        if time.time() - t_start > a.deadline_s: return key, {"error": "not run (deadline)"}
        ck = work / f"tiny_{fmt.replace('-', '_')}"; outf = work / f"{key.replace(':', '_')}.json"
        t = time.time()
        logf = Path(a.out) / f"{a.name}_{key.replace(':', '_')}.log"            # streamed: a hung engine leaves its log
        rc = run_logged(child_command(a, ck, mode, outf, spec, cg, opts), logf, child_timeout(a.deadline_s, time.time() - t_start), env, ROOT)
        if rc != 0: return key, {"error": f"rc {rc}: {logf.read_text(errors='replace')[-1500:]}"}
        res = json.loads(outf.read_text()); res["wall_s"] = round(time.time() - t, 1); res["spec"] = spec; res["cudagraph_mode_asked"] = cg
        res["options_asked"] = opts
        res["kda_op_splits_graphs"] = "vllm::solar_open2_kda_attention" in (res.get("splitting_ops") or [])
        return key, res

    runs = plan(a.formats, a.modes, a.ks, None if a.draft == "none" else a.draft, draft_dir, a.only)
    base, rest = [r for r in runs if r[2] == "base"], [r for r in runs if r[2] != "base"]
    partial = Path(a.out) / f"{a.name}.json"
    with ThreadPoolExecutor(max(1, a.lanes)) as ex:                  # baselines first: a cold machine autotunes once per dtype
        for fut in as_completed([ex.submit(one, r) for r in base + rest]):
            key, res = fut.result()
            report["runs"][key] = res                                 # each run in the file as it ends: a later kill loses no finished run
            partial.write_text(json.dumps({**report, "partial": True, "passed": False}, indent=1) + "\n")
    report["runs"] = {f"{r[0]}:{r[1]}:{r[2]}": report["runs"][f"{r[0]}:{r[1]}:{r[2]}"] for r in base + rest}   # the plan's order
    add_reference(report, work, a.formats, a.weights, a.tie_nats, "cuda")
    report["tie_nats"] = a.tie_nats
    report["failures"] = judge(report)
    if a.norm_probe: report["norm_findings"] = norm_findings(report["runs"])
    report["wall_s"] = round(time.time() - t_start, 1)
    report["passed"] = not report["failures"]
    (Path(a.out) / f"{a.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    summary = {k: ({"error": r["error"][-200:]} if "error" in r else
                   {"init_s": r["init_s"], "single_s": r["single_s"],
                    **{f"{p}_acceptance": r[f"spec_{p}"]["acceptance"] for p in ("single", "batched")},
                    "mean_accepted_length": r["spec_single"]["mean_accepted_length"]})
               for k, r in report["runs"].items()}
    found = {k: f for k, f in (report.get("norm_findings") or {}).items() if f["nonfinite_rows"] or f["outsized"] or f["undersized"]}
    print(json.dumps({"passed": report["passed"], "summary": summary, "failures": report["failures"],
                      **({"norm_findings": found} if a.norm_probe else {})}, indent=1))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
