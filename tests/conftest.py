"""Shared fixtures and the suite's options.

Fixtures: the built-in tiny checkpoint in its three formats, written once per test session; `interpreted` (Triton's
interpreter in a fresh process); `progress` (a detail for the heartbeat line).

Options (`python -m pytest tests --help`, group "solar-open2"): by default the slow checks are left out (tests
marked `slow`, notebook cells tagged `#| slow`); `--slow` adds them, `--only-slow` runs only them (CI's time-boxed
step). While one test runs longer than `--heartbeat` seconds (30), a line says which test is still running (and,
for a notebook, which cell), so the suite is never silent for a minute.
Under pytest-xdist (`make test` runs `-n 2`) the controller names every test running on a worker, with its time.

Under CI (`CI` set, as `.ci/run` does) hypothesis runs derandomized, so a submission's result does not depend on the
draw; locally it explores new examples on every run (that is how the FP8-subnormal block-scale case was found)."""
import os, threading, time
from pathlib import Path

import pytest

try:
    from hypothesis import settings as _hsettings
    _hsettings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"): _hsettings.load_profile("ci")
except ImportError:
    pass


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    "{format: directory} for 'compressed-tensors' (Nota's layout), 'modelopt' and 'bf16' (dequantised experts), seed 0."
    from solar_open2.checkpoint import TINY_FORMATS, make_tiny
    root = tmp_path_factory.mktemp("tiny")
    return {f: make_tiny(root / f, f) for f in TINY_FORMATS}


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory):
    "The docs site of nbs/ plus a fixture chapter, built once per run (tests/docsite.py): (site folder, process)."
    from docsite import build_site
    return build_site(tmp_path_factory.mktemp("docs"))


@pytest.fixture
def interpreted():
    """`run(code)`: Python `code` in a fresh process with Triton's interpreter on (it must be set before Triton is
    imported), from the repository root; returns its stdout. A non-zero exit fails the test with stderr's tail
    (chapter 08c's `run_interpreted`)."""
    from solar_open2.vllm.testing import run_interpreted
    return lambda code, timeout=900: run_interpreted(code, timeout, cwd=Path(__file__).resolve().parents[1])


# ---------------------------------------------------------------------------------------------------------------
# options: which checks run
# ---------------------------------------------------------------------------------------------------------------

def pytest_addoption(parser):
    g = parser.getgroup("solar-open2")
    g.addoption("--slow", action="store_true",
                help="also run the slow checks: tests marked slow and notebook cells tagged '#| slow'")
    g.addoption("--only-slow", action="store_true",
                help="run only the slow checks: tests marked slow, and each notebook with '#| slow' cells, whole")
    g.addoption("--nb-flags", default="", metavar="FLAGS",
                help="more tst_flags to run in the notebooks, space separated (e.g. 'gpu'); default: none")
    g.addoption("--nb-timeout", type=float, default=900, metavar="S",
                help="seconds one notebook may take before its test fails (default: 900)")
    g.addoption("--heartbeat", type=float, default=30, metavar="S",
                help="say which test is still running after this many silent seconds (default: 30; 0: never)")


def pytest_configure(config):
    if hasattr(config, "workerinput") or getattr(config.option, "numprocesses", None):
        # Under xdist (-n N) each worker gets one thread (and so does every process it starts): two workers that each
        # spin torch's two OpenMP threads on a 2-core machine made one notebook 12x slower than alone.
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"): os.environ.setdefault(var, "1")
    config.addinivalue_line("markers", "slow: a long or exhaustive check; left out unless --slow or --only-slow")
    config.addinivalue_line("markers", "fast_variant: a notebook run without its '#| slow' cells (--slow runs the "
                                       "whole notebook instead)")


def pytest_collection_modifyitems(config, items):
    only, slow = config.getoption("--only-slow"), config.getoption("--slow")
    def drop(it):
        is_slow = it.get_closest_marker("slow") is not None
        if only: return not is_slow
        if slow: return it.get_closest_marker("fast_variant") is not None
        return is_slow
    gone = [it for it in items if drop(it)]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [it for it in items if not drop(it)]


# ---------------------------------------------------------------------------------------------------------------
# the heartbeat: a line while a long test runs
# ---------------------------------------------------------------------------------------------------------------

class Heartbeat:
    """A daemon thread that writes `... NODEID: still running, N s (DETAIL)` to the terminal every `every` seconds
    while one test runs. It writes to the terminal pytest itself writes to (a copy of that descriptor taken while
    output capture is suspended), so the line shows even while the test's own output is captured."""
    def __init__(self, fd: int, every: float, tw=None):
        self.fd, self.every, self.lock, self.tw, self.seen = fd, every, threading.Lock(), tw, None
        self.nodeid, self.start, self.last, self.detail = None, 0.0, 0.0, ""
        self.running = {}                                                   # xdist: nodeid -> start time
        threading.Thread(target=self._loop, name="heartbeat", daemon=True).start()

    def begin(self, nodeid):
        with self.lock: self.nodeid, self.start, self.last, self.detail = nodeid, time.time(), time.time(), ""

    def end(self):
        with self.lock: self.nodeid = None

    def add(self, nodeid):
        "Under xdist: a worker began `nodeid` (several run at once; the line names each with its own time)."
        with self.lock: self.running[nodeid], self.nodeid, self.last = time.time(), None, time.time()

    def remove(self, nodeid):
        with self.lock: self.running.pop(nodeid, None); self.last = time.time()

    def _label(self, now: float) -> tuple:
        "(what is running, since when): the one test, or under xdist every test a worker runs."
        if not self.running: return self.nodeid, self.start
        return " + ".join(f"{n} ({now - t:.0f} s)" for n, t in self.running.items()), min(self.running.values())

    def _loop(self):
        while True:
            time.sleep(min(5.0, self.every / 3))
            with self.lock:
                now = time.time()
                label, start = self._label(now)
                if label is None or now - self.last < self.every: continue
                self.last = now
                # a newline first unless pytest's line is empty or still the one this thread left
                line = getattr(self.tw, "_current_line", None)
                fresh = line is not None and (line == "" or line is self.seen)
                msg = ("" if fresh else "\n") + f"    ... {label}: still running, {now - start:.0f} s"
                msg += f" ({self.detail})\n" if self.detail else "\n"
                self.seen = line
            try: os.write(self.fd, msg.encode("utf-8", "replace"))
            except OSError: return


_HEARTBEAT = pytest.StashKey()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    every = session.config.getoption("--heartbeat")
    tr = session.config.pluginmanager.getplugin("terminalreporter")
    if not every or tr is None or hasattr(session.config, "workerinput"): return    # an xdist worker: the controller reports
    capman = session.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled(): fd = os.dup(1)
    else: fd = os.dup(1)
    hb = session.config.stash[_HEARTBEAT] = Heartbeat(fd, every, getattr(tr, "_tw", None))
    if session.config.pluginmanager.has_plugin("dsession"): _XDIST_HEARTBEAT[:] = [hb]   # xdist's controller: log hooks
    hb.begin("collecting tests")  # importing the test modules (torch, vLLM) takes a while too


def pytest_collection_finish(session):
    hb = session.config.stash.get(_HEARTBEAT, None)
    if hb: hb.end()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    hb = item.config.stash.get(_HEARTBEAT, None)
    if hb: hb.begin(item.nodeid)
    try: return (yield)
    finally:
        if hb: hb.end()


_XDIST_HEARTBEAT = []      # the controller's heartbeat under pytest-xdist (`-n N`); these hooks get no config


def pytest_runtest_logstart(nodeid, location):
    "Under xdist the controller hears here that a worker began a test: the heartbeat names the tests now running."
    for hb in _XDIST_HEARTBEAT: hb.add(nodeid)


def pytest_runtest_logfinish(nodeid, location):
    for hb in _XDIST_HEARTBEAT: hb.remove(nodeid)


@pytest.fixture
def progress(request):
    "`progress(text)`: what the current test is doing now, shown on its heartbeat line."
    hb = request.config.stash.get(_HEARTBEAT, None)
    def set_detail(text):
        if hb is not None:
            with hb.lock: hb.detail = str(text)
    return set_detail


# ---------------------------------------------------------------------------------------------------------------
# the slowest notebook cells, after the run (the notebook tests record them)
# ---------------------------------------------------------------------------------------------------------------

def pytest_terminal_summary(terminalreporter, exitstatus, config):
    cells = []
    for rep in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        if rep.when != "call": continue
        for k, v in rep.user_properties:
            if k == "notebook_cells": cells += [(c["seconds"], rep.nodeid, c["index"], c["line"]) for c in v if c["seconds"] >= 1]
    if not cells: return
    terminalreporter.ensure_newline()
    terminalreporter.section("slowest notebook cells")
    for s, nodeid, i, line in sorted(cells, reverse=True)[:10]:
        terminalreporter.write_line(f"{s:7.1f}s  {nodeid.split('::')[-1]} cell {i}: {line}")
