"""Foundation: the package imports on a CPU-only machine without the engine, the CLI entry point works, the README
is generated from index.ipynb, and the acceptance command of the config chapter prints the exact count."""
import json, pkgutil, subprocess, sys
from pathlib import Path

import solar_open2

ROOT = Path(__file__).resolve().parents[1]


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_param_count_command():
    r = _py("from solar_open2.config import SolarOpen2Config as C; print(C.real().count_params())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "250287810304"


def test_reference_modules_import_without_engine():
    "Every module outside solar_open2.vllm imports without pulling in vllm, triton or flashinfer."
    mods = [m.name for m in pkgutil.walk_packages(solar_open2.__path__, "solar_open2.")
            if not m.name.startswith("solar_open2.vllm")]
    assert "solar_open2.config" in mods
    code = ("import sys, importlib\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "bad = sorted(k for k in sys.modules if k.split('.')[0] in ('vllm', 'triton', 'flashinfer'))\n"
            "print(bad)")
    r = _py(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_console_script():
    exe = Path(sys.executable).parent / "solar-open2"
    r = subprocess.run([str(exe), "info", "--preset", "tiny", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layer_types"][0] == "full_attention"
    r = subprocess.run([str(exe), "no-such-command"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "unknown subcommand" in r.stderr


def test_readme_in_sync():
    r = subprocess.run([sys.executable, "scripts/make_readme.py", "--check"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_version_matches_settings():
    import configparser
    cfg = configparser.ConfigParser(delimiters=["="]); cfg.read(ROOT / "settings.ini")
    assert solar_open2.__version__ == cfg["DEFAULT"]["version"]
