"""The prediction-vs-outcome log (`benchmarks/results/current/perf_log.jsonl`): every optimisation step writes down
what it expects before it runs, then what it measured. `python -m benchmarks.engine.perf log ...` appends one row."""
from __future__ import annotations
import argparse, datetime, json, sys
from pathlib import Path

from benchmarks.common import ROOT, RESULTS, git_commit
from benchmarks.engine.perf.cli import PHASES, PRESETS, PROG
from benchmarks.engine.perf.results import gated

LOG_FILE = "perf_log.jsonl"
LOG_PATH = RESULTS / "current" / LOG_FILE     # the log the chapters read; rows are appended to it
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
    "`log`: append one row to the log (the measured value read from a phase JSON, or given)."
    ap = argparse.ArgumentParser(prog=f"{PROG} log", description="append one prediction-vs-outcome row to "
                                 f"benchmarks/results/current/{LOG_FILE}")
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
    ap.add_argument("--log", type=Path, default=LOG_PATH)
    a = ap.parse_args(argv)
    measured, config = a.measured, a.config
    try:
        if a.results:
            res = gated(json.loads(a.results.read_text()), strict=False)      # a gated-out figure is not a measurement
            config = config or res.get("config", "real")
            if measured is None: measured = measured_value(res, a.figure, a.measured_from, str(a.results))
        e = log_entry(a.change, a.figure, a.predicted, measured, a.phase, a.baseline,
                      str(a.results) if a.results else None, a.note, git_commit(ROOT), config=config or "real",
                      measured_from=a.measured_from)
    except (ValueError, OSError, json.JSONDecodeError) as err:
        print(f"{PROG} log: {err}", file=sys.stderr); return 2
    a.log.parent.mkdir(parents=True, exist_ok=True)
    with open(a.log, "a") as f: f.write(json.dumps(e) + "\n")
    print(json.dumps(e))
    return 0

def read_log(path:Path=LOG_PATH)->list:
    "The prediction-vs-outcome log as a list of dicts ([] when absent)."
    p = Path(path)
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
