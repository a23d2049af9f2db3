"""Acceptance of the budget chapter (issue 7), through the CLI function in a fresh interpreter: the published vLLM log
lines, the FP8 block size, the per-rank NVFP4 weights, and one-line errors with exit status 2 on bad input."""
import json, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def budget(*args) -> subprocess.CompletedProcess:
    code = f"import sys; from solar_open2.budget import cli_budget; sys.exit(cli_budget({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_published_configuration_json():
    r = budget("--tp", "2", "--kv-cache-memory-bytes", "28000000000", "--max-model-len", "1048576", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["block_size"] == 1072
    assert j["num_blocks"] == 1062 and j["blocks_per_request"] == 982
    assert j["gpu_kv_cache_tokens"] == 1_133_999
    assert j["log_lines"] == ["GPU KV cache size: 1,133,999 tokens",
                              "Maximum concurrency for 1,048,576 tokens per request: 1.08x"]
    assert f"{j['max_concurrency']:.2f}" == "1.08"
    assert abs(j["weights_per_rank_gib"] / 71.48 - 1) < 0.01
    assert j["kv_cache_memory_bytes"] == 28_000_000_000 and j["tp"] == 2


def test_published_configuration_table():
    r = budget("--tp", "2", "--kv-cache-memory-bytes", "28g", "--max-model-len", "1M")   # the same in vLLM's notation
    assert r.returncode == 0, r.stderr
    assert "GPU KV cache size: 1,133,999 tokens" in r.stdout
    assert "Maximum concurrency for 1,048,576 tokens per request: 1.08x" in r.stdout
    assert "1,072 tokens" in r.stdout


def test_margin_configuration():
    r = budget("--tp", "2", "--kv-cache-memory-bytes", "8g", "--max-model-len", "262144", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["log_lines"][1] == "Maximum concurrency for 262,144 tokens per request: 1.22x"
    r = budget("--tp", "2", "--kv-cache-memory-bytes", "8G", "--max-model-len", "262144", "--json")   # 8 GiB, not 8e9
    assert json.loads(r.stdout)["log_lines"][1].endswith("1.31x")


def test_fp8_and_speculative_json():
    r = budget("--tp", "2", "--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "28g", "--max-model-len", "1M",
               "--enable-prefix-caching", "--num-speculative-tokens", "3", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert (j["block_size"], j["kda_blocks_per_request"], j["num_speculative_blocks"], j["mamba_cache_mode"]) == (2192, 15, 3, "align")


def test_gpu_plan_json():
    r = budget("--gpu", "b200", "--kv-cache-dtype", "fp8", "--gpu-memory-utilization", "0.95", "--max-model-len", "1M",
               "--max-num-seqs", "512", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["gpu"]["name"] == "B200" and j["pool_exact"] is False and j["plan"]["block_size"] == 2128
    assert j["plan"]["head"] is None and j["free_bytes"] == j["gpu"]["memory_bytes"] - j["used_bytes"]


def test_fp8_block_size():
    r = budget("--tp", "2", "--kv-cache-dtype", "fp8", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["block_size"] == 2128


@pytest.mark.parametrize("args,msg", [
    (["--kv-cache-memory-bytes", "-28000000000"], "must be positive"),
    (["--tp", "3"], "--tensor-parallel-size 3 does not divide num_attention_heads (64)"),
    (["--tp", "32"], "NVFP4 group size"),
    (["--kv-cache-dtype", "fp4"], "invalid choice: 'fp4'"),
    (["--kv-cache-memory-bytes", "28e9"], "'28e9' is not an integer"),
    (["--max-model-len", "2M"], "exceeds max_position_embeddings"),
    (["--block-size", "24"], "multiple of 16"),
    (["--model", "/nonexistent/dir"], "no config.json"),
    (["--num-speculative-tokens", "-1"], "num_speculative_tokens must be an integer >= 0"),
    (["--gpu", "a100"], "invalid choice: 'a100'"),
    (["--gpu", "h100", "--gpu-memory-utilization", "0.9"], "leave no KV pool"),
    (["--gpu-memory-utilization", "0.9"], "needs --gpu"),
])
def test_bad_input_one_line_exit_2(args, msg):
    r = budget(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("solar-open2 budget: error:"), r.stderr
    assert msg in lines[0]


def test_pool_too_small_for_one_request_exits_1():
    r = budget("--kv-cache-memory-bytes", "20g")
    assert r.returncode == 1
    assert "vLLM will refuse to start" in r.stdout


def test_import_is_light():
    "The budget runs where vLLM is not installed: importing it pulls in neither the engine nor the plotting stack."
    code = ("import sys, solar_open2.budget as b; b.plan(); "
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('vllm', 'torch', 'matplotlib', 'ipywidgets')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_console_script_when_registered():
    from solar_open2.cli import COMMANDS
    if "budget" not in COMMANDS:
        pytest.skip("`budget` is not in solar_open2.cli.COMMANDS yet (the coordinator adds the registry line)")
    exe = Path(sys.executable).parent / "solar-open2"
    r = subprocess.run([str(exe), "budget", "--tp", "2", "--kv-cache-memory-bytes", "28000000000",
                        "--max-model-len", "1048576", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gpu_kv_cache_tokens"] == 1_133_999
