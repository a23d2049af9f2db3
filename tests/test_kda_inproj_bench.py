"The three-launch KDA decode benchmark (benchmarks.kernels.kda_inproj): its logic on the CPU under Triton's interpreter."
import json, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "benchmarks.kernels.kda_inproj"]   # run from the repository root

def test_no_gpu_exits_2_and_real_shapes():
    if torch.cuda.is_available(): pytest.skip("has a GPU")
    r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
    for flag, bad in (("--pair-tiles", "32x2a6"), ("--fg-tiles", "fma:1")):
        r = subprocess.run(SCRIPT + [flag, bad], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and flag in r.stderr, r.stderr
    from benchmarks.kernels import kda_inproj as m
    assert m.REAL == dict(Hl=32, D=128, W=4, R=128, hidden=4096)                # per rank at TP2
    from solar_open2.vllm.ops.gemv import GEMV_TILES, PAIR_TILES
    assert (3 * 32 * 128 + 32, 4096, "bfloat16") in GEMV_TILES and (2 * 128, 4096, "bfloat16") in GEMV_TILES
    assert (3 * 32 * 128 + 32, 2 * 128, 4096, "bfloat16") in PAIR_TILES        # the pair the script times has a plan
    from benchmarks.common import kind_tiles1
    assert kind_tiles1("same,fma:1x4096,mma:32x256x3") == (None, ("fma", (1, 4096)), ("mma", (32, 256, 3)))

def test_run_on_cpu_under_the_interpreter(tmp_path, interpreted):
    "Checks, today's chain and its parts, the pair GEMV and the kernel per configuration, both chains, the best and the ratio, the JSON."
    code = f"""
import json, sys
from benchmarks.kernels import kda_inproj as m
from solar_open2.kda import kda_beta
us = iter([20.0, 9.0, 3.0, 1.0, 7.0, 8.5, 6.0, 12.0, 11.0, 15.0, 14.5])
timer = lambda fns, reps: ([f() for f in fns], next(us))[1]
res = m.run(tokens=(2,), pair_tiles=((16, 32, 4, 2),), fg_tiles=(None, ("fma", (1, 64))), warps=(4,), block_r=(8, 16),
            rotations=2, reps=1, out_paths=[{str(tmp_path / 'r.json')!r}], device="cpu",
            shapes=dict(Hl=2, D=16, W=4, R=16, hidden=64), timer=timer, beta_fn=kda_beta)
print(json.dumps(res))
"""
    res = json.loads(interpreted(code).strip().splitlines()[-1])
    fp32 = [c for c in res["checks"] if c["kind"] == "fp32 cases"]
    assert len(fp32) == 3 and all(max(c["out"], c["rec_state"], c["conv_state"]) < 1e-5 for c in fp32)
    b = [c for c in res["checks"] if c["kind"].startswith("bf16")][0]
    # the interpreter truncates to bf16 where the GPU rounds: the kernels' distances are looser here than on the GPU
    assert b["three"]["out"] < 3e-2 and b["three_vs_six_out"] < 3e-2 and b["pair_qkvb_equal_single"], b
    assert [(t["path"], t["us"]) for t in res["timings"]] == [
        ("six", 20.0), ("six: qkvb GEMV", 9.0), ("six: gate kernels", 3.0), ("six: beta", 1.0), ("six: kernel", 7.0),
        ("three: pair GEMV 16x32x4x2", 8.5), ("three: pair GEMV 16x32x4x2 + W1 fma 1x64", 6.0),
        ("three: kernel", 12.0), ("three: kernel", 11.0), ("three (plan)", 15.0), ("three", 14.5)]
    assert [t.get("fg_tile") for t in res["timings"][5:7]] == [None, ["fma", [1, 64]]]
    assert res["best"] == {"2": {"six_us": 20.0, "three_us": 14.5, "path": "three", "pair": "16x32x4x2 + W1 fma 1x64",
                                 "num_warps": 4, "block_r": 16, "six_over_three": 1.38, "saved_us": 5.5}}
    assert json.loads((tmp_path / "r.json").read_text())["best"] == res["best"]
    assert json.loads((tmp_path / "r.json").read_text())["gate"]["passed"] is True   # the writer's sanity gate

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and vLLM")
def test_gpu_run(tmp_path):
    r = subprocess.run(SCRIPT + ["--tokens", "1", "--pair-tiles", "32x256x4x3", "--fg-tiles", "fma:1x4096", "--warps", "4",
                        "--block-r", "32", "--reps", "5", "--out", str(tmp_path), "--results-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
