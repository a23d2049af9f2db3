"""Every chapter's notebook is a test: its cells run in order, as `nbdev_test` runs them, and the test fails on the
first cell that raises, with nbdev's report of that cell.

One worker process (`tests/nbharness.py --worker`) runs the notebooks one after another, so torch and vLLM are
imported once and this pytest process stays clean; it reports each cell as it starts, which the heartbeat line
shows. A notebook that crashes the worker or runs past `--nb-timeout` fails alone; the next one gets a new worker.

Cells tagged with a flag of settings.ini's `tst_flags` (`notest gpu slow`) are skipped. A notebook with `#| slow`
cells has a second test, `test_notebook_slow[...]`, marked slow, that runs it whole (`--slow`, `--only-slow`);
`--nb-flags gpu` runs the `#| gpu` cells too (on a CUDA machine).
"""
from __future__ import annotations
import json, os, re, selectors, signal, subprocess, sys, tempfile, time
from pathlib import Path

import pytest

import nbharness

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = nbharness.notebooks()
_SLOW_RE = re.compile(r"^\s*#\|\s*slow\b", re.MULTILINE)


def has_slow_cells(path: Path) -> bool:
    "Whether a code cell of the notebook is tagged `#| slow`."
    nb = json.loads(path.read_text(encoding="utf-8"))
    return any(c["cell_type"] == "code" and _SLOW_RE.search("".join(c["source"])) for c in nb["cells"])


def _id(p: Path) -> str: return p.relative_to(ROOT/"nbs").with_suffix("").as_posix()


SLOW = [p for p in NOTEBOOKS if has_slow_cells(p)]
FAST_PARAMS = [pytest.param(p, id=_id(p), marks=[pytest.mark.fast_variant] if p in SLOW else []) for p in NOTEBOOKS]
SLOW_PARAMS = [pytest.param(p, id=_id(p), marks=[pytest.mark.slow]) for p in SLOW]


class Worker:
    "A `nbharness.py --worker` process: `run(path, force_flags, timeout, on_cell)` -> the harness's result dict."
    def __init__(self):
        self.proc = None

    def _start(self):
        self.log = tempfile.NamedTemporaryFile("w+b", prefix="nbworker-", suffix=".log", delete=False)
        r, w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("nbharness.py")), "--worker",
                                      "--fd", str(w)], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=subprocess.STDOUT, pass_fds=(w,), start_new_session=True)
        os.close(w)
        self.rfd, self.buf = r, b""
        self.sel = selectors.DefaultSelector(); self.sel.register(r, selectors.EVENT_READ)
        ev = self._next(120)
        if ev is None or ev.get("event") != "ready": self._fail_start(ev)

    def _fail_start(self, ev):
        tail = self.log_tail(); self.close()
        pytest.fail(f"the notebook worker did not start ({ev}):\n{tail}", pytrace=False)

    def _next(self, timeout):
        "The next JSON line within `timeout` seconds; None on timeout; {'event': 'eof'} when the worker died."
        deadline = time.time() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.time()
            if left <= 0 or not self.sel.select(left): return None
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk: return {"event": "eof"}
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def log_tail(self, n=4000) -> str:
        try:
            self.log.flush(); data = Path(self.log.name).read_bytes()
            return data[-n:].decode("utf-8", "replace")
        except OSError: return ""

    def run(self, path: Path, force_flags, timeout: float, on_cell=None) -> dict:
        if self.proc is None or self.proc.poll() is not None: self._start()
        log_start = Path(self.log.name).stat().st_size
        self.proc.stdin.write((json.dumps({"path": str(path), "force_flags": list(force_flags)}) + "\n").encode())
        self.proc.stdin.flush()
        deadline, cell = time.time() + timeout, None
        while True:
            ev = self._next(max(0.0, deadline - time.time()))
            if ev is None or ev["event"] == "eof":
                died = ev is not None
                rc = self.proc.poll()
                if not died: self.kill()
                data = Path(self.log.name).read_bytes()[log_start:][-4000:].decode("utf-8", "replace")
                where = f"in cell {cell['index']} ({cell['line']!r})" if cell else "before its first cell"
                what = f"the worker died (exit {rc})" if died else f"it ran past --nb-timeout {timeout:.0f} s"
                self.close()
                return {"ok": False, "seconds": None, "cells": [], "error": f"{path.name}: {what} {where}.\n"
                        f"Worker output:\n{data}"}
            if ev["event"] == "cell":
                cell = ev
                if on_cell: on_cell(ev)
            elif ev["event"] == "done":
                return ev

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try: os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError: pass
            self.proc.wait()

    def close(self):
        if self.proc is None: return
        try: self.proc.stdin.close()
        except OSError: pass
        try: self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired: self.kill()
        self.sel.close(); os.close(self.rfd)
        try: os.unlink(self.log.name)
        except OSError: pass
        self.proc = None


@pytest.fixture(scope="session")
def nb_worker():
    w = Worker()
    yield w
    w.close()


def _check(path, force, nb_worker, progress, request, record_property):
    force = list(force) + request.config.getoption("--nb-flags").split()
    n = sum(1 for _ in json.loads(path.read_text(encoding="utf-8"))["cells"])
    res = nb_worker.run(path, force, request.config.getoption("--nb-timeout"),
                        on_cell=lambda ev: progress(f"cell {ev['index']} of {n}: {ev['line']}"))
    ran = [c for c in res["cells"] if c["seconds"] is not None]
    record_property("notebook_cells", [{k: c[k] for k in ("index", "line", "seconds")} for c in ran])
    if not res["ok"]: pytest.fail(res["error"] or f"{path.name} failed", pytrace=False)


@pytest.mark.parametrize("path", FAST_PARAMS)
def test_notebook(path, nb_worker, progress, request, record_property):
    "The notebook's cells run without error (`#| slow`, `#| gpu`, `#| notest` cells skipped)."
    _check(path, (), nb_worker, progress, request, record_property)


@pytest.mark.parametrize("path", SLOW_PARAMS)
def test_notebook_slow(path, nb_worker, progress, request, record_property):
    "The whole notebook, its `#| slow` cells included."
    _check(path, ("slow",), nb_worker, progress, request, record_property)


def test_every_notebook_is_collected():
    "The notebooks under test are the ones nbdev_test would run, and each chapter of nbs/ is among them."
    names = {p.name for p in NOTEBOOKS}
    assert "00_config.ipynb" in names and "index.ipynb" in names
    on_disk = {p.name for p in (ROOT/"nbs").glob("*.ipynb")}
    assert on_disk <= names, f"not tested: {sorted(on_disk - names)}"
