"The pair-GEMV benchmark script (benchmarks.kernels.gemv_pair): the real pair shapes, its flags, its logic on the CPU."
import json, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "benchmarks.kernels.gemv_pair"]   # run from the repository root

def test_no_gpu_exits_2_bad_flags_name_themselves_and_real_shapes():
    if torch.cuda.is_available(): pytest.skip("has a GPU")
    r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
    for flag, bad in (("--tiles0", "same"), ("--tiles1", "fma:1"), ("--pairs", "gqa,mlp")):
        r = subprocess.run(SCRIPT + [flag, bad], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and flag in r.stderr, r.stderr
    from benchmarks.kernels import gemv_pair as m
    assert m.PAIRS == {"gqa": ("gqa.qkv_proj + gqa.g_proj", 5120, 4096, 4096), "kda": ("kda.qkvb_proj + kda.fg_a_proj", 12320, 256, 4096)}
    from benchmarks.common import kind_tiles0, kind_tiles1
    assert kind_tiles0("mma:32x256x4x3,fma:4x1024x4") == (("mma", (32, 256, 4, 3)), ("fma", (4, 1024, 4)))
    assert kind_tiles1("same,fma:4x2048x2") == (None, ("fma", (4, 2048, 2)))

def test_run_on_cpu_under_the_interpreter(tmp_path, interpreted):
    "Checks, the separate calls and every tile pair timed, the best and the ratio, the JSON."
    code = f"""
import json, sys
from benchmarks.kernels import gemv_pair as m
us = iter([10.0, 9.0, 7.0, 12.0, 20.0, 8.0])
timer = lambda fns, reps: ([f() for f in fns], next(us))[1]
res = m.run(tokens=(2, 9), pairs=("p",), tiles0=(("mma", (16, 32, 4, 2)),), tiles1=(None, ("fma", (2, 32))), reps=1,
            out_paths=[{str(tmp_path / 'r.json')!r}], device="cpu", shapes={{"p": ("a + b", 40, 24, 64)}}, timer=timer,
            l2_bytes=1, max_copies=2, dtype="float32")   # fp32: the interpreter truncates bf16 where the GPU rounds
print(json.dumps(res))
"""
    res = json.loads(interpreted(code).strip().splitlines()[-1])
    assert all(c["pass"] for c in res["checks"]) and len(res["checks"]) == 5, res["checks"]
    assert [(t["tokens"], t["path"], t["us"], t["copies"]) for t in res["timings"]] == [
        (2, "separate", 10.0, 2), (2, "mma 16x32x4x2", 9.0, 2), (2, "mma 16x32x4x2 + W1 fma 2x32", 7.0, 2),
        (9, "separate", 12.0, 2), (9, "mma 16x32x4x2", 20.0, 2)]                # no FMA rows past 8 tokens
    assert res["best"] == {"p": {"2": {"separate_us": 10.0, "pair_us": 7.0, "tiles": "mma 16x32x4x2 + W1 fma 2x32", "separate_over_pair": 1.43},
                                 "9": {"separate_us": 12.0, "pair_us": 20.0, "tiles": "mma 16x32x4x2", "separate_over_pair": 0.6}}}
    assert json.loads((tmp_path / "r.json").read_text())["best"] == res["best"]
    assert json.loads((tmp_path / "r.json").read_text())["gate"]["passed"] is True   # the writer's sanity gate

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and vLLM")
def test_gpu_run(tmp_path):
    r = subprocess.run(SCRIPT + ["--tokens", "1", "--pairs", "gqa", "--tiles0", "mma:32x256x4x3",
                        "--tiles1", "same", "--reps", "5", "--out", str(tmp_path), "--results-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
