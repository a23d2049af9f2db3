"""Run the chapters' notebooks as tests, one notebook at a time, the way `nbdev_test` does, with timings per cell.

`run_notebook(path)` executes a notebook's code cells in order in this process (nbdev's own `CaptureShell`, in the
notebook's folder, cells tagged with a `tst_flags` flag of settings.ini skipped unless forced, `#| eval: false`
never run) and returns a dict: `ok`, `seconds`, `error` (nbdev's traceback text), and `cells`, one entry per code
cell: index, first line, seconds (None when skipped) and the flag that skipped it.

`python tests/nbharness.py --worker` serves `run_notebook` to `tests/test_notebooks.py`: one JSON request a line on
stdin, progress and results as JSON lines on the descriptor given by `--fd` (anything the notebooks print goes to
stderr). One worker runs the notebooks one after another, as `nbdev_test --n_workers 0` does, so torch and vLLM
are imported once, and the pytest process that drives it stays clean.

`python tests/nbharness.py [NOTEBOOK ...] [--flags slow] [--json FILE]` runs notebooks and prints their cost
(`nbdev_test --timing`, plus the slowest cells).
"""
from __future__ import annotations
import argparse, configparser, json, os, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tst_flags(root: Path = ROOT) -> list[str]:
    "settings.ini's `tst_flags`: cells tagged with one of these are skipped unless forced."
    cfg = configparser.ConfigParser(delimiters=["="])
    cfg.read(root/"settings.ini", encoding="utf-8")
    return cfg["DEFAULT"].get("tst_flags", "").split()


def notebooks(root: Path = ROOT) -> list[Path]:
    "Every notebook nbdev_test would run: nbs/**/*.ipynb except hidden/underscored paths and `.notest` folders."
    from nbdev.doclinks import nbglob
    from nbdev.test import _keep_file
    files = nbglob(str(root/"nbs"), as_path=True)
    return [Path(f).absolute() for f in sorted(files) if _keep_file(Path(f), ".notest")]


def _first_line(src: str) -> str:
    lines = [l for l in src.splitlines() if l.strip() and not l.lstrip().startswith("#|")]
    return (lines[0] if lines else (src.splitlines() or [""])[0]).strip()[:80]


def run_notebook(path, force_flags=(), skip_flags=None, on_cell=None) -> dict:
    """Execute `path` as nbdev_test does; `on_cell(index, first_line)` is called before each executed cell.
    Returns {"ok", "seconds", "cpu_seconds", "error", "cells": [{"index", "line", "seconds", "skipped"}]};
    `cpu_seconds` counts this process and the subprocesses it waited for (a loaded machine stretches `seconds`,
    hardly this)."""
    from nbdev.process import NBProcessor
    from nbdev.processors import FrontmatterProc, nb_lang
    from execnb.shell import CaptureShell
    from fastcore.basics import str2bool
    from fastcore.xtras import working_directory
    path = Path(path).absolute()
    if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
    os.environ["IN_TEST"] = "1"
    skip = set(tst_flags() if skip_flags is None else skip_flags) - set(force_flags)
    nb = NBProcessor(path, procs=FrontmatterProc, process=True).nb
    fm = getattr(nb, "frontmatter_", {})
    res = {"notebook": path.name, "ok": True, "seconds": 0.0, "cpu_seconds": 0.0, "error": None, "cells": []}
    if str2bool(fm.get("skip_exec", False)) or nb_lang(nb) != "python": return res
    cells, t = res["cells"], {}

    def pre(cell):  # True: do not execute (nbdev_test's `_no_eval`)
        if cell.cell_type != "code": return True
        d = getattr(cell, "directives_", {}) or {}
        why = ("nbdev_export" if "nbdev_export" + "(" in cell.source else
               "eval: false" if d.get("eval:", [""])[0].lower() == "false" else
               next(iter(sorted(skip & d.keys())), None))
        cells.append({"index": cell.idx_, "line": _first_line(cell.source), "seconds": None, "skipped": why})
        if why: return True
        if on_cell: on_cell(cell.idx_, cells[-1]["line"])
        t["start"] = time.perf_counter()
        return False

    def post(cell): cells[-1]["seconds"] = round(time.perf_counter() - t["start"], 3)

    start, cpu0 = time.perf_counter(), _cpu()
    fresh_torch_state()
    shell = CaptureShell(path)
    try:
        with working_directory(path.parent): shell.run_all(nb, exc_stop=True, preproc=pre, postproc=post)
    except BaseException as e:
        if cells and cells[-1]["seconds"] is None and not cells[-1]["skipped"]:
            cells[-1]["seconds"] = round(time.perf_counter() - t["start"], 3)
        res["ok"] = False
        try: res["error"] = shell.prettytb(fname=path)
        except Exception: res["error"] = f"{type(e).__name__}: {e}"
        if isinstance(e, KeyboardInterrupt): raise
    res["seconds"], res["cpu_seconds"] = round(time.perf_counter() - start, 3), round(_cpu() - cpu0, 3)
    return res


def fresh_torch_state():
    """Torch's process-wide switches back at their defaults before a notebook runs, as `nbdev_test` starts each notebook
    in a process of its own: a notebook that turns gradients off for its inference cells (`torch.set_grad_enabled(False)`)
    must not turn them off for the next notebook this worker runs."""
    torch = sys.modules.get("torch")
    if torch is None: return
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)


def _cpu() -> float:
    "CPU seconds of this process and of its waited-for children, user and system."
    import resource
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def worker(fd: int):
    "Serve requests {'path', 'force_flags'} from stdin; write {'event': 'cell'|'done', ...} lines to `fd`."
    out = os.fdopen(fd, "w", buffering=1)
    sys.stdout = sys.stderr  # the notebooks' own prints never reach the protocol
    def send(**kw): out.write(json.dumps(kw) + "\n"); out.flush()
    send(event="ready", pid=os.getpid())
    for line in sys.stdin:
        if not line.strip(): continue
        req = json.loads(line)
        res = run_notebook(req["path"], req.get("force_flags", ()),
                           on_cell=lambda i, l: send(event="cell", index=i, line=l, t=time.time()))
        send(event="done", **res)


def report(results: list[dict], top: int = 15) -> str:
    "The cost table: notebooks by time, then the slowest executed cells over all of them."
    lines = [f"{'notebook':34} {'seconds':>8} {'cpu s':>8}  result"]
    for r in sorted(results, key=lambda r: -r["seconds"]):
        lines.append(f"{r['notebook']:34} {r['seconds']:8.1f} {r.get('cpu_seconds', 0):8.1f}  {'ok' if r['ok'] else 'FAILED'}")
    lines.append(f"{'total':34} {sum(r['seconds'] for r in results):8.1f} {sum(r.get('cpu_seconds', 0) for r in results):8.1f}")
    cells = [(c["seconds"], r["notebook"], c["index"], c["line"]) for r in results for c in r["cells"] if c["seconds"]]
    lines += ["", f"slowest cells (of {len(cells)} executed):"]
    for s, nb, i, l in sorted(cells, reverse=True)[:top]: lines.append(f"{s:8.1f}  {nb} cell {i}: {l}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run notebooks as nbdev_test does and report their cost per cell.")
    ap.add_argument("notebooks", nargs="*", help="default: every notebook nbdev_test would run")
    ap.add_argument("--flags", nargs="*", default=[], help="tst_flags to run anyway (e.g. slow)")
    ap.add_argument("--json", help="also write the per-cell results to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker: return worker(a.fd if a.fd is not None else os.dup(1))
    os.chdir(ROOT)
    results = []
    for p in [Path(n).absolute() for n in a.notebooks] or notebooks():
        r = run_notebook(p, a.flags)
        results.append(r)
        print(f"{r['notebook']}: {r['seconds']:.1f} s {'ok' if r['ok'] else 'FAILED'}", flush=True)
        if not r["ok"]: print(r["error"], file=sys.stderr)
        if a.json: Path(a.json).write_text(json.dumps(results, indent=1))
    print(report(results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__": sys.exit(main())
