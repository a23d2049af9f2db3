"""`benchmarks` as a package: every benchmark runs as `python -m benchmarks....` from the repository root with no
`sys.path` edits, and what they share (`benchmarks.common`): the command line they record and the JSON writer,
which writes nothing without the benchmark's sanity gate and withholds the summary figures of a failed one."""
import ast, json, subprocess, sys
from pathlib import Path

import pytest

from benchmarks import common

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p for p in (ROOT / "benchmarks").rglob("*.py") if "results" not in p.parts)


def test_no_module_edits_sys_path_or_loads_a_file_by_path():
    """The package imports itself: no `sys.path` preamble (at module level: the engine harness may still put a plugin
    shim on its own engine's path inside a function), no `spec_from_file_location` anywhere."""
    bad = []
    for p in MODULES:
        tree = ast.parse(p.read_text(), str(p))
        top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for node in (n for s in top for n in ast.walk(s)):
            if isinstance(node, ast.Attribute) and (getattr(node.value, "id", None), node.attr) == ("sys", "path"):
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert MODULES and not bad, bad
    planted = ast.parse("import sys\nsys.path.insert(0, '.')\n")                     # what the check finds
    assert any(isinstance(n, ast.Attribute) and (getattr(n.value, "id", None), n.attr) == ("sys", "path") for n in ast.walk(planted))


def test_every_benchmark_is_a_package_module_with_help(tmp_path):
    "Each runnable module answers --help from anywhere the repository is on PYTHONPATH (here: a foreign cwd)."
    mods = ["benchmarks.engine.perf", "benchmarks.engine.plot", "benchmarks.engine.parity", "benchmarks.engine.chat_server",
            "benchmarks.kernels.gemv", "benchmarks.kernels.kda_cpu", "benchmarks.index"]
    code = ("import runpy, sys\nfor m in sys.argv[1:]:\n    sys.argv = [m, '--help']\n    try: runpy.run_module(m, run_name='__main__')\n"
            "    except SystemExit as e: assert e.code == 0, (m, e.code)\n    print('ok', m, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code, *mods], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert [l.split()[1] for l in r.stdout.splitlines() if l.startswith("ok ")] == mods


def test_command_line_names_the_module():
    from types import SimpleNamespace
    as_module = SimpleNamespace(__spec__=SimpleNamespace(name="benchmarks.kernels.gemv"))
    argv = ["/x/benchmarks/kernels/gemv.py", "--tokens", "1"]
    assert common.command_line(argv, as_module) == "python -m benchmarks.kernels.gemv --tokens 1"
    pkg = SimpleNamespace(__spec__=SimpleNamespace(name="benchmarks.engine.perf.__main__"))
    assert common.command_line(["/x/perf/__main__.py", "--phase", "graphs"], pkg) == "python -m benchmarks.engine.perf --phase graphs"
    assert common.command_line(argv, SimpleNamespace(__spec__=None)) == "python /x/benchmarks/kernels/gemv.py --tokens 1"


def test_the_writer_needs_a_gate_and_withholds_the_figures_of_a_failed_one(tmp_path):
    res = {"checks": [{"pass": True}], "timings": [{"us": 3.0}], "best": {"1": {"us": 3.0}}, "step_us": {"M1": 9.0}}
    with pytest.raises(TypeError): common.json_writer(res, [tmp_path / "r.json"])                       # no gate at all
    with pytest.raises(TypeError, match="sanity gate"): common.json_writer(res, [tmp_path / "r.json"], None, "rule")
    with pytest.raises(TypeError, match="sanity gate"): common.json_writer(res, [tmp_path / "r.json"], bool, "")
    gate = lambda r: all(c["pass"] for c in r["checks"])
    save = common.json_writer(res, [tmp_path / "a" / "r.json", tmp_path / "b.json"], gate, "every check passes")
    save()
    good = json.loads((tmp_path / "a" / "r.json").read_text())
    assert good["gate"] == {"passed": True, "rule": "every check passes"} and good["best"] == res["best"]
    assert (tmp_path / "b.json").read_text() == (tmp_path / "a" / "r.json").read_text()
    res["checks"].append({"pass": False})                                     # a check fails after a save: the next save
    save()
    bad = json.loads((tmp_path / "b.json").read_text())
    assert bad["gate"]["passed"] is False and "best" not in bad and "step_us" not in bad
    assert bad["withheld"] == {"best": res["best"], "step_us": res["step_us"]} and bad["timings"] == res["timings"]
    assert "best" in res and "withheld" not in res                            # the benchmark's own dict is untouched
    broken = common.gated_view({"checks": [{}]}, gate, "r")                   # a malformed check: not passed
    assert broken["gate"]["passed"] is False


def test_every_kernel_benchmark_declares_its_gate():
    "Each kernel benchmark module defines `gate` and `GATE_RULE` and hands both to the writer."
    from importlib import import_module
    names = sorted(p.stem for p in (ROOT / "benchmarks" / "kernels").glob("*.py") if p.stem != "__init__")
    assert names == ["gemv", "gemv_pair", "kda_cpu", "kda_decode", "kda_gates", "kda_inproj", "kda_verify", "moe_batch", "moe_decode", "moe_profile", "moe_router", "nvfp4_dequant", "train_step"]
    for n in names:
        m = import_module(f"benchmarks.kernels.{n}")
        assert callable(m.gate) and isinstance(m.GATE_RULE, str) and m.GATE_RULE, n
        src = (ROOT / "benchmarks" / "kernels" / f"{n}.py").read_text()
        assert "json_writer(" in src and ", gate, GATE_RULE" in src, n


def test_run_logged_streams_returns_the_status_and_on_timeout_dumps_then_kills_the_whole_group(tmp_path):
    """benchmarks.common.run_logged: the output is in the log as it comes; past the limit every Python process of the
    group prints its stack (SIGABRT with PYTHONFAULTHANDLER) and a grandchild (vLLM's engine core) dies with it."""
    import sys, time
    from benchmarks.common import run_logged
    log = tmp_path / "a.log"
    assert run_logged([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], log, 30) == 3
    assert log.read_text().strip() == "hi"
    gc = tmp_path / "gc.pid"
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import os, sys, time; open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(600)', sys.argv[1]])\n"
            "print('started', flush=True)\n"
            "def waiting_for_the_engine(): time.sleep(600)\n"
            "waiting_for_the_engine()\n")
    t = time.time()
    assert run_logged([sys.executable, "-c", code, str(gc)], log, 3, grace_s=5) == 124
    assert time.time() - t < 20
    text = log.read_text()
    assert text.startswith("started") and "Fatal Python error: Aborted" in text and "waiting_for_the_engine" in text
    assert "[run_logged: no exit after 3 s" in text
    pid = int(gc.read_text())
    for _ in range(50):                                                 # gone, or a zombie waiting for init to reap it
        try: state = open(f"/proc/{pid}/stat").read().split(")")[1].split()[0]
        except FileNotFoundError: break
        if state == "Z": break
        time.sleep(0.1)
    else: raise AssertionError(f"the grandchild {pid} outlived the group's kill (state {state})")
