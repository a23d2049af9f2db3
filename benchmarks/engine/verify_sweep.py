"""The verify step's cost against k, from `perf --phase ab` summaries (issue 27): one JSON and one plot.

    python -m benchmarks.engine.verify_sweep SUMMARY.json [SUMMARY.json ...] [--out DIR] [--name verify_sweep]

Each summary is a `perf_h200[_rank]_ab.json` whose baseline decodes without speculation and whose other variants
speculate with k drafts a step (`--ngram K` padded, or `--draft-head K`), on dummy weights whose continuation the
proposer never matches: every draft is rejected, so each step verifies 1 + k tokens and yields one, and the median
step is the verify's cost (`checks.sh spec-rank`, `SPEC_RANK_METHOD=ngram`). Each variant is set against its own
summary's baseline (a job's engines share a machine; several jobs may split the ks) and against the budget chapter's
floor for it (`budget.verify_bytes`: the routed experts of 1 + k tokens, a KDA state stored per token), in bytes and
as time at the baseline's bandwidth. A k whose figure failed its sanity gate, or whose drafts were accepted (then a
step is not one verify), is listed with the reason and left out of the sweep. Writes DIR/NAME.json and DIR/NAME.png.
"""
from __future__ import annotations
import argparse, json, re, sys
from pathlib import Path

from benchmarks.engine.perf.cli import model_config
from solar_open2 import budget

TARGET_K, TARGET_RATIO = 3, 1.3          # issue 27: the step at k = 3 within 1.3x the step at k = 0

def sweep_rows(summary:dict, source:str="")->tuple:
    """(rows, skipped) of one A/B summary: per speculative variant k, its median step against the baseline's and the
    floor; `skipped` names each variant left out and why."""
    vs = summary["variants"]
    base_name = summary["baseline"]
    base = vs[base_name]
    bset = base.get("settings") or {}
    if bset.get("ngram") or bset.get("draft_head"):
        raise ValueError(f"{source}: the baseline {base_name!r} speculates; the sweep needs a plain step as its baseline")
    figs = [n for n in (base.get("figures") or {}) if re.fullmatch(r"decode_bs1_ctx\d+", n)]
    if len(figs) != 1: raise ValueError(f"{source}: the baseline has {len(figs)} single-stream decode figures, need one")
    fname = figs[0]
    bf = base["figures"][fname]
    ctx = int(round(int(fname.rsplit("ctx", 1)[1]) + (bset.get("decode_tokens") or 0) / 2))   # perf's roofline context
    cfg, tp = model_config(bset["config"]), bset["tp"]                       # the config and TP perf served
    bandwidth = bf["value_tok_s"] / bf["fraction_of_roofline"] * budget.decode_bytes(cfg, tp, ctx)   # the baseline's card
    one = budget.decode_bytes(cfg, tp, ctx)
    rows, skipped = [], []
    for n, v in vs.items():
        s = v.get("settings") or {}
        k = 0 if n == base_name else (s.get("ngram") or s.get("draft_head"))
        f = (v.get("figures") or {}).get(fname)
        why = ("no figure: " + str(v.get("error") or v.get("status"))[:120] if f is None else
               "failed its sanity gate" if fname in (v.get("gated_out") or []) else
               "speculates with no k" if n != base_name and not k else
               "ngram drafts not padded (spec_pad_drafts): a step may verify fewer than 1 + k tokens"
               if s.get("ngram") and not s.get("spec_pad_drafts") else
               f"drafts accepted ({f.get('acceptance'):.0%}): a step is not one verify" if f.get("acceptance") else None)
        if why:
            skipped.append({"variant": n, "source": source, "why": why})
            continue
        vb = budget.verify_bytes(cfg, tp, ctx, 1 + k)
        rows.append({"k": k, "tokens": 1 + k, "variant": n, "source": source, "step_ms": f["itl_median_ms"],
                     "step_over_k0": f["itl_median_ms"] / bf["itl_median_ms"], "floor": vb / one,
                     "floor_ms": bf["itl_median_ms"] * vb / one, "roofline_ms": vb / bandwidth * 1e3,
                     "fraction_of_roofline": vb / bandwidth * 1e3 / f["itl_median_ms"], "bytes_per_step": vb,
                     "method": "ngram" if s.get("ngram") else "draft_head" if s.get("draft_head") else None})
    return rows, skipped, {"context": ctx, "bandwidth_Bps": bandwidth, "baseline_ms": bf["itl_median_ms"]}

def sweep(paths:list)->dict:
    "The sweep over every summary in `paths`, sorted by k, with the target's verdict at k = 3 (its fastest engine)."
    rows, skipped, bases = [], [], []
    for p in paths:
        r, s, b = sweep_rows(json.loads(Path(p).read_text()), Path(p).name)
        rows += r; skipped += s; bases.append({"source": Path(p).name, **b})
    rows.sort(key=lambda r: (r["k"], r["source"]))
    at = sorted((r for r in rows if r["k"] == TARGET_K), key=lambda r: r["step_over_k0"])   # the best engine at k = 3
    verdict = (None if not at else
               {"k": TARGET_K, "target_ratio": TARGET_RATIO, "measured_ratio": at[0]["step_over_k0"], "floor": at[0]["floor"],
                "met": at[0]["step_over_k0"] <= TARGET_RATIO, "reachable": at[0]["floor"] <= TARGET_RATIO})
    return {"schema": 1, "benchmark": "verify_sweep", "sources": [Path(p).name for p in paths], "baselines": bases,
            "rows": rows, "skipped": skipped, "target": verdict,
            "rule": "each step verifies 1 + k tokens and keeps one (every draft rejected); floor: budget.verify_bytes(1 + k) / "
                    "decode_bytes, the least a verify can cost against the plain step at the same share of the bandwidth"}

def plot(res:dict, out:Path|None=None):
    "Median step against k: measured, the floor at the baseline's efficiency, the bytes' roofline, and the 1.3x target."
    import matplotlib
    if out is not None: matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = res["rows"]
    if not rows: raise ValueError("the sweep has no rows: " + "; ".join(f"{s['variant']}: {s['why']}" for s in res["skipped"]))
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ks = [r["k"] for r in rows]
    ax.plot(ks, [r["step_ms"] for r in rows], "o-", color="#2b6cb0", label="measured median step")
    ax.plot(ks, [r["floor_ms"] for r in rows], "s--", color="#38a169", label="floor: the k = 0 step x bytes(1 + k) / bytes(1)")
    ax.plot(ks, [r["roofline_ms"] for r in rows], ":", color="#444444", label="bytes / bandwidth (roofline)")
    base = [r for r in rows if r["k"] == 0]
    if base:
        ax.plot([TARGET_K], [TARGET_RATIO * base[0]["step_ms"]], "*", ms=12, color="#c53030", label=f"target: {TARGET_RATIO}x at k = {TARGET_K}")
    for r in rows:
        ax.annotate(f"x{r['step_over_k0']:.2f}\n(floor x{r['floor']:.2f})", (r["k"], r["step_ms"]), fontsize=6,
                    textcoords="offset points", xytext=(0, 6), ha="center")
    ax.set_xlabel("draft tokens k (each step verifies 1 + k, keeps 1)", fontsize=8); ax.set_ylabel("ms a step", fontsize=8)
    ax.set_ylim(0, 1.25 * max(r["step_ms"] for r in rows)); ax.tick_params(labelsize=7); ax.legend(fontsize=6, loc="upper left")
    import textwrap
    ax.set_title("\n".join(textwrap.wrap("the verify step against k, one stream: " + ", ".join(res["sources"]), 90)), fontsize=7)
    fig.tight_layout()
    if out is not None: fig.savefig(out, dpi=110)
    return fig

def main(argv:list|None=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("summaries", nargs="+", type=Path, help="perf --phase ab summaries (perf_h200[_rank]_ab.json)")
    ap.add_argument("--out", type=Path, default=None, help="folder for NAME.json and NAME.png (default: the first summary's)")
    ap.add_argument("--name", default="verify_sweep")
    a = ap.parse_args(argv)
    for p in a.summaries:
        if not p.is_file(): ap.error(f"no such summary: {p}")
    res = sweep(a.summaries)
    res["command"] = "python -m benchmarks.engine.verify_sweep " + " ".join(map(str, argv if argv is not None else sys.argv[1:]))
    out = a.out or a.summaries[0].parent
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps(res, indent=1) + "\n")
    for r in res["rows"]:
        print(f"k = {r['k']}: {r['step_ms']:6.2f} ms a step, x{r['step_over_k0']:.2f} the plain step (floor x{r['floor']:.2f}), "
              f"{r['fraction_of_roofline']:.1%} of its roofline  [{r['variant']}, {r['source']}]")
    for s in res["skipped"]: print(f"left out {s['variant']} ({s['source']}): {s['why']}")
    if res["rows"]:
        try: plot(res, out / f"{a.name}.png")
        except ImportError as e: print(f"no plot ({e}): run this again where matplotlib is, on the same summaries")
    t = res["target"]
    if t: print(f"target at k = {t['k']}: {t['measured_ratio']:.2f}x measured, {t['target_ratio']}x asked, floor {t['floor']:.2f}x: "
                + ("met" if t["met"] else "not met" + ("" if t["reachable"] else ", and under the floor")))
    return 0 if res["rows"] else 1

if __name__ == "__main__":
    sys.exit(main())
