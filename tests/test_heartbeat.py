"""The heartbeat (tests/conftest.py): the line that names a long-running test, alone and under pytest-xdist, where the
controller hears of the workers' tests through the log hooks and names each with its own time."""
import os, time

from conftest import Heartbeat


def _heard(r: int, wait: float) -> str:
    time.sleep(wait)
    try: return os.read(r, 1 << 16).decode()
    except BlockingIOError: return ""


def test_one_test_then_silence():
    r, w = os.pipe(); os.set_blocking(r, False)
    hb = Heartbeat(w, every=0.3)
    hb.begin("tests/x.py::test_long")
    out = _heard(r, 0.8)
    assert "tests/x.py::test_long: still running" in out
    hb.end(); _heard(r, 0.2)
    assert _heard(r, 0.8) == ""                                  # nothing running: no line


def test_xdist_names_every_running_test():
    r, w = os.pipe(); os.set_blocking(r, False)
    hb = Heartbeat(w, every=0.3)
    hb.begin("collecting tests")
    hb.add("tests/a.py::test_a"); hb.add("tests/b.py::test_b")
    out = _heard(r, 0.8)
    assert "tests/a.py::test_a (" in out and " + tests/b.py::test_b (" in out and "collecting tests" not in out
    hb.remove("tests/a.py::test_a")
    out = _heard(r, 0.8).strip().splitlines()[-1]
    assert "tests/b.py::test_b (" in out and "test_a" not in out
    hb.remove("tests/b.py::test_b"); _heard(r, 0.2)
    assert _heard(r, 0.8) == ""                                  # all finished: silent (not "collecting tests")
