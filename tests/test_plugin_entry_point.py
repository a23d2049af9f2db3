"""The installed package declares the vLLM plugin entry point, and vLLM's own plugin loader, in a fresh process,
registers the architecture, the config class and the chat parsers through it (no file patched, no remote code)."""
import subprocess, sys
from importlib.metadata import entry_points

import pytest

pytest.importorskip("vllm")


def test_entry_point_is_installed():
    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("solar_open2") == "solar_open2.vllm:register", eps


def test_vllm_loads_the_plugin_in_a_fresh_process():
    code = (
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm.model_executor.models.registry import ModelRegistry\n"
        "assert 'SolarOpen2ForCausalLM' in ModelRegistry.get_supported_archs()\n"
        "from transformers import AutoConfig\n"
        "from transformers.models.auto.configuration_auto import CONFIG_MAPPING\n"
        "assert 'solar_open2' in CONFIG_MAPPING\n"
        "from vllm.reasoning import ReasoningParserManager\n"
        "from vllm.tool_parsers import ToolParserManager\n"
        "ReasoningParserManager.get_reasoning_parser('solar_open2')\n"
        "ToolParserManager.get_tool_parser('solar_open2')\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "VLLM_PLUGINS": "solar_open2"})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
