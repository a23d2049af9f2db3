"""Shared fixtures: the built-in tiny checkpoint in its three formats, written once per test session."""
import pytest


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    "{format: directory} for 'compressed-tensors' (Nota's layout), 'modelopt' and 'bf16' (dequantised experts), seed 0."
    from solar_open2.checkpoint import TINY_FORMATS, make_tiny
    root = tmp_path_factory.mktemp("tiny")
    return {f: make_tiny(root / f, f) for f in TINY_FORMATS}
