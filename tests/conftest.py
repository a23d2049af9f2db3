"""Shared fixtures: the built-in tiny checkpoint in its three formats, written once per test session.

Under CI (`CI` set, as `.ci/run` does) hypothesis runs derandomized, so a submission's result does not depend on the
draw; locally it explores new examples on every run (that is how the FP8-subnormal block-scale case was found)."""
import os
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


@pytest.fixture
def interpreted():
    """`run(code)`: Python `code` in a fresh process with Triton's interpreter on (it must be set before Triton is
    imported), from the repository root; returns its stdout. A non-zero exit fails the test with stderr's tail
    (chapter 08c's `run_interpreted`)."""
    from solar_open2.vllm.testing import run_interpreted
    return lambda code, timeout=900: run_interpreted(code, timeout, cwd=Path(__file__).resolve().parents[1])
