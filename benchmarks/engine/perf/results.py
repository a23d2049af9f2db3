"""The engine benchmark's result files: the head of a phase's JSON (command, tree, settings, versions), its writer, which
gates every figure on its output-diversity check (a figure that fails it, or has none, is never reported as a
result: it moves to `gated_out`), the merge of the two phases with the acceptance checks, and the A/B summary."""
from __future__ import annotations
import contextlib, datetime, json, platform, re, sys
from pathlib import Path

from benchmarks.common import ROOT, git_commit, git_dirty, source_digest
from benchmarks.engine.perf.cli import CONFIG_NOTES, PLUGIN_KEYS, PROG, run_name, stem
from benchmarks.engine.perf.figures import sanity_passed

SCHEMA = 2                       # 2: figures gated on their sanity check (`gated_out`, `gate`)

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
    "`obj` as JSON to every path (parents created; written to a temporary name, then renamed)."
    text = json.dumps(obj, indent=1, default=str) + "\n"
    for p in paths:
        p = Path(p); p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp"); tmp.write_text(text); tmp.replace(p)

GATE_RULE = ("a figure is a result only if its requests passed the output-diversity check (decode: not every request "
             "repeated one token id; prefill: not every prompt gave the same first token)")

def gated(res:dict, strict:bool=True)->dict:
    """The view of a phase result that is written and read: `figures` holds only the figures whose sanity check
    passed; the others move to `gated_out` with their check and the reason. `strict` (the writer): a figure without
    a sanity record is a bug of the harness and raises; not strict (reading files written before the gate): such a
    figure is gated out as unchecked. Idempotent."""
    figs, san = dict(res.get("figures") or {}), res.get("sanity") or {}
    missing = [k for k in figs if k not in san]
    if strict and missing:
        raise ValueError(f"figures {missing} have no sanity check: a figure is written only with its gate (GATE_RULE)")
    out = {k: v for k, v in res.items()}
    out["figures"], held = {}, dict(res.get("gated_out") or {})
    for k, f in figs.items():
        v = sanity_passed(san.get(k))
        if v: out["figures"][k] = f
        else: held[k] = {"figure": f, "sanity": san.get(k),
                         "why": "no sanity check recorded" if k not in san else "the check failed" if v is False else "unchecked"}
    out["gated_out"] = held
    out["gate"] = {"rule": GATE_RULE, "passed": sorted(out["figures"]), "gated_out": sorted(held)}
    return out

def write_result(res:dict, paths:list)->None:
    "A phase's JSON: the gated view of `res` (`gated`, strict) to every path."
    write_json(gated(res), paths)

def settings(a, phase:str)->dict:
    "Every setting of a phase, as it ran (None: the engine's or the plugin's own default)."
    return {"config": a.config, "phase": phase, "tp": a.tp, "max_model_len": a.max_model_len,
            "kv_cache_memory_bytes": a.kv_bytes, "max_num_seqs": a.max_num_seqs,
            "max_num_batched_tokens": a.max_num_batched_tokens, "prefix_caching": False, "dtype": "bfloat16",
            "load_format": _dummy(a)["load_format"], "dummy_weights": a.dummy_weights, "quantization": "compressed-tensors NVFP4 (routed experts), BF16 elsewhere",
            "enforce_eager": phase == "eager", "compile": None if phase == "eager" else a.compile,
            "cudagraph_capture_sizes": None if phase == "eager" else sorted(a.capture_sizes),
            "moe_backend_requested": a.moe_backend, "attention_backend_requested": a.attention_backend,
            "attn_max_splits": a.attn_max_splits, **{dest: getattr(a, dest) for dest, _, _ in PLUGIN_KEYS},
            "allreduce_fusion_requested": None if phase == "eager" else a.allreduce_fusion, "variant": a.variant, "only": a.only,
            "compile_sizes": None if phase == "eager" else a.compile_sizes, "max_autotune": phase != "eager" and a.max_autotune,
            "env": dict(a.env or []), "draft_head": a.draft_head, "draft_vocab": a.draft_vocab if a.draft_head else None,
            "ngram": getattr(a, "ngram", None), "ngram_gpu": bool(getattr(a, "ngram_gpu", False)), "prompt_period": getattr(a, "prompt_period", 0),
            "log_stats": getattr(a, "log_stats", False),
            "decode_contexts": a.decode_contexts, "decode_tokens": a.decode_tokens,
            "prefill_contexts": a.prefill_contexts, "prefill_repeats": a.prefill_repeats, "batch_sizes": a.batch_sizes,
            "batch_prompt": a.batch_prompt, "batch_tokens": a.batch_tokens, "profile": a.profile,
            "profile_steps": a.profile_steps if a.profile else None, "deadline_s": a.deadline_s,
            "smi_interval_ms": a.smi_interval_ms, "smi_ab": a.smi_ab, "smi_during_measure": a.smi_during_measure}

def new_result(a, phase:str, argv:list)->dict:
    "The JSON of one phase before its engine starts."
    return {"schema": SCHEMA, "benchmark": "perf_h200", "phase": phase, "config": a.config, "status": "started",
            "error": None, "command": f"{PROG} " + " ".join(argv),
            "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(ROOT), "git_dirty": git_dirty(ROOT), "source_sha256": source_digest(ROOT), "host": platform.node(), "settings": settings(a, phase),
            "versions": None, "gpu": None, "env": None, "plugin": None, "engine": None, "kv_pool": None,
            "memory": None, "figures": {}, "figure_details": {}, "profile": None, "sanity": {}, "skipped": [], "errors": [],
            "timeline": [], "roofline_source": "solar_open2.budget.decode_ceiling, H200 4.8e12 B/s per GPU, same TP/context/batch",
            "config_note": CONFIG_NOTES.get(a.config), "dummy_weights": _dummy(a)}

def _dummy(a)->dict:
    from benchmarks.engine.perf.run import dummy_weights      # run imports this module: late
    return dummy_weights(a)

# --------------------------------------------------------------------------------------------------------------
# merge and acceptance, the A/B summary
# --------------------------------------------------------------------------------------------------------------

ACCEPT_GRAPHS_OVER_EAGER = 2.0
ACCEPT_FRACTION = 0.60

def _verdict(v:bool|None)->str: return "passed" if v else "failed" if v is False else "unchecked"

def as_measured(res:dict)->dict:
    """A phase result with every figure it measured, gated or not (the history's view of runs made before the gate
    existed): `figures` holds them all, and each one's gate verdict ("passed", "failed", "unchecked") is in `verdicts`."""
    out = dict(res)
    figs = dict(res.get("figures") or {})
    for k, held in (res.get("gated_out") or {}).items(): figs.setdefault(k, held["figure"])
    san = res.get("sanity") or {}
    out["figures"], out["gated_out"] = figs, {}
    out["verdicts"] = {k: _verdict(sanity_passed(san.get(k))) for k in figs}
    return out

def merge(eager:dict|None, graphs:dict|None, gate:bool=True)->dict:
    """One summary of both phases: each figure's eager and graphs values, their ratio, and the acceptance checks. Only
    figures that passed their sanity gate are summarised (each phase is read through `gated`, so a file written before
    the gate cannot bring in a failed figure); the others are listed under `gated_out`. `gate=False` is the history's
    view (chapter 09a): every figure as it was measured, each row saying its gate verdict; never a current result."""
    view = (lambda v: gated(v, strict=False)) if gate else as_measured
    phases = {k: view(v) for k, v in (("eager", eager), ("graphs", graphs)) if v}
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
                     "graphs_over_eager": (g["value_tok_s"] / e["value_tok_s"]) if e and g else None,
                     "gate": "passed" if gate else "/".join(sorted({r.get("verdicts", {}).get(k, "unchecked")
                                                                   for r in phases.values() if k in r["figures"]}))})
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
    return {"schema": SCHEMA, "benchmark": "perf_h200", "phase": "merged" if gate else "merged_as_measured", "config": first.get("config"),
            "phases": {p: {"status": r.get("status"), "command": r.get("command"), "started_utc": r.get("started_utc"),
                           "wall_s": r.get("wall_s"), "versions": r.get("versions"), "gpu": (r.get("gpu") or {}).get("name"),
                           "settings": r.get("settings"), "memory": r.get("memory"), "skipped": r.get("skipped"),
                           "init_s": (r.get("engine") or {}).get("init_s")} for p, r in phases.items()},
            "rows": rows, "kv_pool": kv, "nvfp4_moe_backend": moe, "acceptance": acc, "gate_rule": GATE_RULE,
            "gated_out": {p: (r.get("gate") or {}).get("gated_out", []) for p, r in phases.items()},
            "dummy_weights": {p: (r.get("dummy_weights") or {}).get("name") for p, r in phases.items()},
            "profile": {p: r.get("profile") for p, r in phases.items() if r.get("profile")}}

def _figure_order(k:str):
    kind = 0 if k.startswith("decode_bs1_") else 1 if k.startswith("prefill") else 2
    return (kind, int(re.findall(r"\d+", k)[-1]))

def read_phase(path:Path)->dict|None:
    """A result JSON as written (None if absent or unreadable). Files written before the gate hold ungated figures:
    read those through `gated(r, strict=False)` before reporting a figure."""
    p = Path(path)
    try: return json.loads(p.read_text()) if p.exists() else None
    except json.JSONDecodeError: return None

def load_results(results_dir:Path, config:str="real")->dict:
    "{'eager': ..., 'graphs': ..., 'merged': ...} of whatever JSON files exist in `results_dir` (None where absent)."
    return {key: read_phase(Path(results_dir) / name)
            for key, name in (("eager", f"{stem(config)}_eager.json"), ("graphs", f"{stem(config)}_graphs.json"),
                              ("merged", f"{stem(config)}.json"))}

def run_merge(a)->int:
    "`--phase merge`: the two phases' JSON (from --out first, then --results-dir) into one summary."
    r = load_results(a.results_dir, a.config)
    if a.out:                                                         # prefer fresher copies in $OUT
        for k, v in load_results(a.out, a.config).items():
            if v and k != "merged": r[k] = v
    try: m = merge(r["eager"], r["graphs"])
    except ValueError as e:
        print(f"{PROG} --phase merge: {e} (looked in {a.results_dir})", file=sys.stderr); return 2
    write_json(m, out_paths(a, f"{stem(a.config)}.json"))
    for row in m["rows"]:
        print(f"{row['figure']:22s} eager {row['eager_tok_s'] or float('nan'):9.1f}  graphs {row['graphs_tok_s'] or float('nan'):9.1f}  "
              f"roofline {row['roofline_tok_s']:9.1f}")
    print(json.dumps(m["acceptance"], indent=1))
    return 0

def spec_figure(f:dict, base:dict|None)->dict:
    """A speculative variant's decode figure: tokens per step, acceptance and mean accepted length (vLLM's counters),
    and its median step against the baseline's (`step_over_baseline`: what one verify of 1 + k tokens costs, drafting
    included, when every draft is rejected) beside the bytes' floor of that ratio (`verify_floor`, `spec_roofline`). Empty for a figure recorded before these were (no `tokens_per_step`)."""
    if f.get("tokens_per_step") is None: return {}
    b = (base or {}).get("itl_median_ms")
    return {"tokens_per_step": f.get("tokens_per_step"), "acceptance": f.get("acceptance"),
            "mean_accepted_length": f.get("mean_accepted_length"),
            "step_over_baseline": f["itl_median_ms"] / b if b and f.get("itl_median_ms") else None,
            "verify_floor": (f.get("spec_roofline") or {}).get("floor_ratio")}   # what step_over_baseline cannot go under

def ab_summary(runs:dict)->dict:
    """Figures and profile families of each A/B variant (first = baseline), with each figure's ratio to the baseline;
    only figures that passed their sanity gate (each run read through `gated`), the others under `gated_out`."""
    runs = {n: gated(r or {}, strict=False) for n, r in runs.items()}
    names = list(runs)
    base = runs[names[0]] or {}
    out = {"schema": SCHEMA, "benchmark": "perf_h200", "phase": "ab", "baseline": names[0], "gate_rule": GATE_RULE, "variants": {}}
    for n in names:
        r = runs[n] or {}
        figs = r.get("figures", {})
        prof = r.get("profile") or {}
        out["variants"][n] = {
            "status": r.get("status"), "error": r.get("error"), "command": r.get("command"),
            "settings": r.get("settings"), "init_s": (r.get("engine") or {}).get("init_s"),
            "dummy_weights": (r.get("dummy_weights") or {}).get("name"), "gated_out": r["gate"]["gated_out"],
            "figures": {k: {"value_tok_s": f["value_tok_s"], "fraction_of_roofline": f["fraction_of_roofline"],
                            "itl_median_ms": f.get("itl_median_ms"),
                            "over_baseline": (f["value_tok_s"] / base["figures"][k]["value_tok_s"])
                            if k in base.get("figures", {}) else None,
                            **spec_figure(f, base.get("figures", {}).get(k))} for k, f in figs.items()},
            "profile": {"step_us": prof.get("step_us"), "gpu_busy_fraction": prof.get("gpu_busy_fraction"),
                        "kernels_per_step": (round(sum(x["kernels"] for x in prof.get("families", [])) / prof["steps"], 1)
                                             if prof.get("steps") else None),
                        "families_us_per_step": {x["family"]: x["us_per_step"] for x in prof.get("families", [])}}
            if prof and not prof.get("error") else prof or None}
    return out

def read_ab_runs(a)->dict:
    "The variants' graphs-phase JSON files from --out (preferred) or --results-dir."
    runs = {}
    for name, _ in a.ab_variants:
        ps = [Path(d) / f"{run_name(a.config, 'graphs', name)}.json" for d in (a.out, a.results_dir) if d]
        p = next((p for p in ps if p.exists()), ps[-1])
        runs[name] = read_phase(p) or {"status": "missing", "error": f"no result file {p}"}
    return runs

def write_ab(a, argv:list, runs:dict)->int:
    "`perf_h200_ab.json` from the variants' results, and one line per figure."
    summary = ab_summary(runs)
    summary["command"] = f"{PROG} " + " ".join(argv)
    summary["runs"] = {n: {"started_utc": r.get("started_utc"), "host": r.get("host"), "git_commit": r.get("git_commit"),
                           "gpu": (r.get("gpu") or {}).get("name")} for n, r in runs.items()}
    write_json(summary, out_paths(a, f"{stem(a.config)}_ab.json"))
    for n, v in summary["variants"].items():
        for k, f in v["figures"].items():
            print(f"[perf_h200] ab {n:12s} {k:22s} {f['value_tok_s']:9.1f} tok/s  x{f['over_baseline'] or float('nan'):.3f}", flush=True)
    return 0 if all(r.get("figures") for r in runs.values()) else 1
