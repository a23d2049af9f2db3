"""Plot the H200 performance results against the budget chapter's rooflines.

    python -m benchmarks.engine.plot [--results-dir benchmarks/results/incoming] [--config real] [--out PNG]
    python -m benchmarks.engine.plot --ab [--results-dir ...] [--out PNG]     # the A/B summary (perf_h200_ab.json)
    python -m benchmarks.engine.plot --progress [--log PATH] [--out PNG]      # the log's single-stream outcomes

Reads `perf_h200_eager.json`, `perf_h200_graphs.json` (whichever exist) and draws four panels: single-stream decode
per context, batch decode per batch size, prefill per context (each: eager, CUDA graphs, and the roofline; the
fraction of the roofline printed on each bar), and the decode step's time by kernel family from the profile next
to the bytes-per-token model. Without results it draws the rooflines and the model alone, marked "not yet
measured". Writes `perf_h200.png` beside the JSON unless --out says otherwise.
"""
from __future__ import annotations
import argparse, re, sys
from pathlib import Path

from benchmarks.common import INCOMING
from benchmarks.engine import perf as ph

COLORS = {"eager": "#d9822b", "graphs": "#2b6cb0", "roofline": "#444444", "model": "#9aa5b1"}
MODEL_ALLREDUCE_US = (38.0, 8.0)   # NCCL eager, measured on the x2 machine; a one-shot custom all-reduce (assumed)
FAMILY_COLORS = {"dense_gemm": "#2b6cb0", "moe": "#38a169", "kda": "#d69e2e", "attention": "#805ad5",
                 "allreduce": "#e53e3e", "norm_act": "#718096", "sampling": "#a0aec0", "memcpy": "#cbd5e0", "other": "#e2e8f0"}

def _settings(results:dict, config:str)->dict:
    "Settings of the first phase present, else the preset's (so the rooflines can be drawn without results)."
    for k in ("graphs", "eager"):
        if results.get(k): return results[k]["settings"]
    p = dict(ph.PRESETS[config]); p["config"] = config
    return p

def panel_data(results:dict, config:str="real")->dict:
    "What each panel draws: per figure key, the roofline and the measured values of each phase present."
    s = _settings(results, config)
    cfg = ph.model_config(config)
    tp, dt, bp, bt = s["tp"], s["decode_tokens"], s["batch_prompt"], s["batch_tokens"]
    fig = lambda phase, key: ((results.get(phase) or {}).get("figures") or {}).get(key)
    out = {"decode": [], "batch": [], "prefill": [], "measured": any(results.get(p) for p in ph.PHASES)}
    for c in s["decode_contexts"]:
        k = f"decode_bs1_ctx{c}"
        out["decode"].append({"key": k, "label": f"{c // 1024}K" if c >= 1024 else str(c),
                              "roofline": ph.decode_roofline(cfg, tp, c + dt / 2)["per_seq_tok_s"],
                              **{p: fig(p, k) and fig(p, k)["value_tok_s"] for p in ph.PHASES}})
    for b in s["batch_sizes"]:
        k = f"decode_bs{b}"
        out["batch"].append({"key": k, "label": str(b), "roofline": ph.decode_roofline(cfg, tp, bp + bt / 2, b)["aggregate_tok_s"],
                             **{p: fig(p, k) and fig(p, k)["value_tok_s"] for p in ph.PHASES}})
    for c in s["prefill_contexts"]:
        k = f"prefill_ctx{c}"
        out["prefill"].append({"key": k, "label": f"{c // 1024}K" if c >= 1024 else str(c),
                               "roofline": ph.prefill_roofline(cfg, tp, c)["tok_s"],
                               **{p: fig(p, k) and fig(p, k)["value_tok_s"] for p in ph.PHASES}})
    c0 = s["decode_contexts"][0]
    out["model_us"] = {us: ph.predicted_step_us(cfg, tp, c0, allreduce_us=us) for us in MODEL_ALLREDUCE_US}
    out["profile"] = {p: (results.get(p) or {}).get("profile") for p in ph.PHASES if (results.get(p) or {}).get("profile")}
    out["profile_context"] = c0
    return out

def fmt(v, spec:str=",.1f")->str:
    "A table cell: numbers formatted, None as an em dash, booleans as yes/no."
    if v is None: return "—"
    if isinstance(v, bool): return "yes" if v else "no"
    if isinstance(v, (int, float)): return format(v, spec)
    return str(v)

def markdown_table(rows:list, cols:list)->str:
    "A Markdown table of `rows` (dicts); `cols` = [(header, key or callable, format spec)]."
    head = "| " + " | ".join(h for h, _, _ in cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = "".join("| " + " | ".join(fmt(k(r) if callable(k) else r.get(k), f) for _, k, f in cols) + " |\n" for r in rows)
    return head + body

def _bars(ax, rows, title, ylabel):
    import numpy as np
    x = np.arange(len(rows)); w = 0.27
    for i, p in enumerate(ph.PHASES):
        vals = [r[p] or 0 for r in rows]
        bars = ax.bar(x + (i - 0.5) * w, vals, w, color=COLORS[p], label=p if any(vals) else None)
        for b, r, v in zip(bars, rows, vals):
            if v: ax.annotate(f"{100 * v / r['roofline']:.0f}%", (b.get_x() + b.get_width() / 2, v), ha="center",
                              va="bottom", fontsize=7)
    ax.hlines([r["roofline"] for r in rows], x - 1.3 * w, x + 1.3 * w, colors=COLORS["roofline"], linestyles="--",
              label="roofline", zorder=3)
    ax.set_xticks(x, [r["label"] for r in rows]); ax.set_yscale("log")
    vals = [v for r in rows for v in [r["roofline"]] + [r[p] for p in ph.PHASES] if v]
    ax.set_ylim(min(min(vals), min(r["roofline"] for r in rows) / 30) / 2, max(vals) * 2.5)
    if not any(r[p] for r in rows for p in ph.PHASES):
        ax.text(0.5, 0.5, "not yet measured", transform=ax.transAxes, ha="center", fontsize=10, color="#c53030")
    ax.set_title(title, fontsize=9); ax.set_ylabel(ylabel, fontsize=8); ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="lower left")

def _profile(ax, d):
    bars = [(f"model, AR {us:g} us", {k: v for k, v in m.items() if k != "total"}) for us, m in d["model_us"].items()]
    for p, prof in d["profile"].items():
        bars.append((p, {r["family"]: r["us_per_step"] or 0 for r in prof.get("families", [])}))
    fams = [f for f in ph.FAMILIES if any(f in b for _, b in bars)]
    bottom = [0.0] * len(bars)
    for f in fams:
        vals = [b.get(f, 0) / 1e3 for _, b in bars]
        ax.bar(range(len(bars)), vals, bottom=bottom, color=FAMILY_COLORS[f], label=f)
        bottom = [x + v for x, v in zip(bottom, vals)]
    ax.set_xticks(range(len(bars)), [n.replace(", ", "\n") for n, _ in bars], fontsize=7)
    ax.set_ylabel("ms per decode step (rank 0)", fontsize=8); ax.tick_params(labelsize=7)
    ax.set_title(f"decode step by kernel family, batch 1, {d['profile_context']:,}-token context", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    if not d["profile"]: ax.set_xlabel("profile not yet measured: the bytes-per-token model only", fontsize=9, color="#c53030")

def plot(results:dict, out:Path|None=None, config:str="real"):
    "The four-panel figure; saved to `out` when given; returns the matplotlib Figure."
    import matplotlib
    if out is not None: matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = panel_data(results, config)
    fig, axs = plt.subplots(2, 2, figsize=(11, 7.5))
    _bars(axs[0, 0], d["decode"], "single-stream decode (tok/s), by prompt length", "tok/s")
    _bars(axs[0, 1], d["batch"], "batch decode (aggregate tok/s), by concurrent sequences", "tok/s")
    _bars(axs[1, 0], d["prefill"], "prefill (prompt tok/s; roofline = 989 TFLOP/s compute)", "tok/s")
    _profile(axs[1, 1], d)
    gpu = next(((results.get(p) or {}).get("gpu") or {}).get("name") for p in ph.PHASES if results.get(p)) if d["measured"] else None
    title = f"Solar-Open2 ({config}) through the vLLM plugin, TP{_settings(results, config)['tp']}"
    title += f", {gpu}" if gpu else " - not yet measured: rooflines (H200, budget chapter) only"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    return fig

def ab_rows(ab:dict)->list:
    "Per A/B variant and figure: tok/s, roofline, ratio to the baseline, and profile families (µs per step) when profiled."
    rows = []
    for name, v in ab["variants"].items():
        fams = ((v.get("profile") or {}).get("families_us_per_step") or {})
        for key, f in (v.get("figures") or {}).items():
            rows.append({"variant": name, "figure": key, "tok_s": f["value_tok_s"],
                         "roofline": f["value_tok_s"] / f["fraction_of_roofline"], "over_baseline": f.get("over_baseline"),
                         "itl_median_ms": f.get("itl_median_ms"), "families": fams,
                         **{k: f.get(k) for k in ("acceptance", "mean_accepted_length", "step_over_baseline", "verify_floor")}})
    return rows

def plot_ab(ab:dict, out:Path|None=None):
    "Two panels: each variant's figures against the roofline (ratio to the baseline on the bar); their profiles by family."
    import matplotlib
    if out is not None: matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = ab_rows(ab)
    if not rows: raise ValueError("the A/B summary has no figures")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [f"{r['variant']}\n{r['figure'].replace('decode_bs1_ctx', 'bs1, ctx ')}" for r in rows]
    bars = a1.bar(range(len(rows)), [r["tok_s"] for r in rows], color=COLORS["graphs"])
    for b, r in zip(bars, rows):
        a1.annotate(f"{r['tok_s']:.1f} tok/s\n{100 * r['tok_s'] / r['roofline']:.1f}% of roofline"
                    + (f"\nx{r['over_baseline']:.3f}" if r["over_baseline"] else "")
                    + (f"\nstep x{r['step_over_baseline']:.2f}" if r.get("step_over_baseline") else "")
                    + (f" (floor x{r['verify_floor']:.2f})" if r.get("verify_floor") and r.get("step_over_baseline") else "")
                    + (f"\nacc {100 * r['acceptance']:.0f}%, L {r['mean_accepted_length']:.2f}"
                       if r.get("acceptance") is not None and r.get("mean_accepted_length") is not None else ""),
                    (b.get_x() + b.get_width() / 2, r["tok_s"]), ha="center", va="bottom", fontsize=7)
    a1.hlines([r["roofline"] for r in rows], [i - 0.4 for i in range(len(rows))], [i + 0.4 for i in range(len(rows))],
              colors=COLORS["roofline"], linestyles="--", label="roofline")
    a1.axhline(0.6 * max(r["roofline"] for r in rows), color="#c53030", lw=0.8, ls=":", label="60 % target")
    a1.set_xticks(range(len(rows)), labels, fontsize=7); a1.set_ylabel("tok/s", fontsize=8); a1.tick_params(labelsize=7)
    a1.set_ylim(0, 1.15 * max(r["roofline"] for r in rows)); a1.legend(fontsize=7, loc="upper right")
    a1.set_title(f"A/B, CUDA graphs (baseline: {ab['baseline']})", fontsize=9)
    prof = [(r["variant"], r["families"]) for r in rows if r["families"]]
    bottom = [0.0] * len(prof)
    for f in [f for f in ph.FAMILIES if any(f in fams for _, fams in prof)]:
        vals = [(fams.get(f) or 0) / 1e3 for _, fams in prof]
        a2.bar(range(len(prof)), vals, bottom=bottom, color=FAMILY_COLORS[f], label=f)
        bottom = [x + v for x, v in zip(bottom, vals)]
    a2.set_xticks(range(len(prof)), [n for n, _ in prof], fontsize=7); a2.tick_params(labelsize=7)
    a2.set_ylabel("ms per profiled decode step (rank 0)", fontsize=8); a2.set_title("profiled variants, by kernel family", fontsize=9)
    if prof: a2.legend(fontsize=6, ncol=2)
    else: a2.text(0.5, 0.5, "no variant was profiled", transform=a2.transAxes, ha="center", fontsize=9, color="#c53030")
    fig.tight_layout()
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    return fig

PROGRESS_TITLES = {"real": "2x H200 TP2", "rank": "one TP2 rank, one H200", "tiny": "tiny, one GPU"}

def progress_rows(log:list, figure:str="decode_bs1_ctx2048", phase:str="graphs", config:str="real")->list:
    "The log's measured outcomes of `figure` in `phase` for `config` (rows without one: real), in order: label, predicted, measured."
    rows = []
    for r in log:
        if r.get("figure") != figure or r.get("phase") != phase or r.get("measured_tok_s") is None: continue
        if r.get("config", "real") != config: continue
        label = re.sub(r"^outcome(?: \([^)]*\))?: ", "", str(r["change"])).split(";")[0].split(" (")[0]
        rows.append({"label": label, "date": r["date"], "predicted": r.get("predicted_tok_s"), "measured": r["measured_tok_s"],
                     "results": r.get("results")})
    return rows

def plot_progress(log:list, roofline:float, out:Path|None=None, figure:str="decode_bs1_ctx2048", config:str="real"):
    "One panel: each measured change's single-stream decode (bars) and its prediction (dots), the roofline and the 60 % target."
    import matplotlib
    if out is not None: matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import textwrap
    rows = progress_rows(log, figure, config=config)
    if not rows: raise ValueError(f"the log has no measured {figure} outcome of --config {config}")
    fig, ax = plt.subplots(figsize=(max(7.0, 1.6 * len(rows)), 4.4))
    x = range(len(rows))
    bars = ax.bar(x, [r["measured"] for r in rows], color=COLORS["graphs"], label="measured")
    ax.scatter(x, [r["predicted"] for r in rows], color="#d9822b", zorder=3, s=14, label="predicted before the run")
    for b, r in zip(bars, rows):
        ax.annotate(f"{r['measured']:.1f}\n{100 * r['measured'] / roofline:.1f}%", (b.get_x() + b.get_width() / 2, r["measured"]),
                    ha="center", va="bottom", fontsize=7)
    ax.axhline(roofline, color=COLORS["roofline"], ls="--", lw=0.9, label=f"roofline {roofline:.0f} tok/s")
    ax.axhline(0.6 * roofline, color="#c53030", ls=":", lw=0.9, label="60 % target")
    ax.set_xticks(list(x), ["\n".join(textwrap.wrap(r["label"], 20)[:4]) for r in rows], fontsize=6)
    ax.set_ylabel("tok/s, one stream, 2K prompt", fontsize=8); ax.tick_params(labelsize=7)
    ax.set_ylim(0, 1.1 * roofline); ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"{figure}, CUDA graphs, {PROGRESS_TITLES[config]}: every measured change (perf_log.jsonl)", fontsize=9)
    fig.tight_layout()
    if out is not None: fig.savefig(out, dpi=120); plt.close(fig)
    return fig

def main(argv:list|None=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results-dir", type=Path, default=INCOMING, help="where the phase / A/B JSON are read and the PNG written")
    ap.add_argument("--log", type=Path, default=ph.LOG_PATH, help="--progress: the prediction-vs-outcome log")
    ap.add_argument("--config", choices=tuple(ph.PRESETS), default="real")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ab", action="store_true", help="plot perf_h200_ab.json (the A/B summary) instead")
    ap.add_argument("--progress", action="store_true", help="plot the log's measured single-stream outcomes instead")
    a = ap.parse_args(argv)
    if a.progress:
        log = ph.read_log(a.log)
        cfg = ph.model_config(a.config)
        roof = ph.decode_roofline(cfg, ph.PRESETS[a.config]["tp"], 2048 + 96)["per_seq_tok_s"]
        out = a.out or a.results_dir / f"{ph.stem(a.config)}_progress.png"
        plot_progress(log, roof, out, config=a.config)
        print(f"wrote {out}")
        return 0
    if a.ab:
        import json
        src = a.results_dir / f"{ph.stem(a.config)}_ab.json"
        if not src.exists(): print(f"python -m benchmarks.engine.plot: no {src}", file=sys.stderr); return 2
        out = a.out or a.results_dir / f"{ph.stem(a.config)}_ab.png"
        plot_ab(json.loads(src.read_text()), out)
        print(f"wrote {out}")
        return 0
    res = ph.load_results(a.results_dir, a.config)
    out = a.out or a.results_dir / f"{ph.stem(a.config)}.png"
    plot(res, out, a.config)
    print(f"wrote {out}" + ("" if any(res.get(p) for p in ph.PHASES) else " (no results yet: rooflines only)"))
    return 0

if __name__ == "__main__":
    sys.exit(main())
