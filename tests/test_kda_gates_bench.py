"The KDA low-rank gate benchmark (benchmarks.kernels.kda_gates): its logic on the CPU, its GPU run when there is one."
import json, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "benchmarks.kernels.kda_gates"]   # run from the repository root

def test_no_gpu_exits_2_and_bad_flags_name_themselves():
    if torch.cuda.is_available(): pytest.skip("has a GPU")
    r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
    r = subprocess.run(SCRIPT + ["--b-tiles", "32y"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--b-tiles" in r.stderr

def test_real_shapes_and_the_check_rule():
    from benchmarks.kernels import kda_gates as m
    from solar_open2.config import SolarOpen2Config
    from solar_open2.vllm.ops.kda_gates import checks_pass
    assert m.real_shapes(SolarOpen2Config.real()) == dict(d=4096, r=128, P=4096)     # chapter 09's per-rank table
    ok = {"dtype": "bfloat16", "rel_rms": 2.0e-3, "plain_rel_rms": 1.3e-3}
    assert checks_pass([ok, {"dtype": "float32", "rel_rms": 2e-7, "plain_rel_rms": 1e-7}])
    assert not checks_pass([{**ok, "rel_rms": 3.0e-3}])                       # > 1.5 x 1.3e-3 + 1e-3
    assert not checks_pass([{"dtype": "float32", "rel_rms": 2e-6, "plain_rel_rms": 0.0}])

def test_run_on_cpu_under_the_interpreter(tmp_path, interpreted):
    "The whole script path (checks, per-launch and joint timing, bytes, JSON) at small shapes, the interpreter, a fake timer."
    code = f"""
import json, sys
from benchmarks.kernels import kda_gates as m
n = [0]
def timer(fns, reps):
    for f in fns: f()
    n[0] += 1
    return {{1: 9.0, 3: 4.0, 4: 2.5}}.get(n[0] % 6, 5.0)     # per token count: cublas 9, a: 2nd tile faster, b: 1st
res = m.run(tokens=(1, 3, 20), a_tiles=((2, 32, 4), (4, 64, 4)), b_tiles=((16, 16, 4), (8, 16, 2)), reps=1,
            out_paths=[{str(tmp_path / 'r.json')!r}], device="cpu", shapes=dict(d=64, r=16, P=40), timer=timer,
            deadline_s=600, l2_bytes=20000)
print(json.dumps(n[0]))
"""
    out = interpreted(code)
    assert json.loads(out.strip().splitlines()[-1]) == 12                 # 6 timings per token count, 20 skipped
    res = json.loads((tmp_path / "r.json").read_text())
    assert all(c["rel_rms"] < 1e-6 for c in res["checks"] if c["dtype"] == "float32")
    assert res["checks_pass"] is False      # the GPU bound, applied; the interpreter's bf16 truncation misses it (chapter 08h)
    assert res["gate"]["passed"] is False and "best" not in res                # so the writer's gate withholds the figures
    res["best"] = res["withheld"]["best"]                                       # (kept, for the record)
    assert [c["kind"] for c in res["checks"]][-2:] == ["real shapes"] * 2
    assert [t["kernel"] for t in res["timings"]] == ["cublas", "a", "a", "b", "b", "triton"] * 2
    assert res["skipped"] == [{"tokens": 20, "why": "more than MAX_TOKENS=8"}]
    b = res["best"]["3"]
    assert (b["a"]["tile"], b["b"]["tile"], b["triton"]["tile"]) == ([4, 64, 4], [16, 16, 4], [[4, 64, 4], [16, 16, 4]])
    assert b["speedup"] == round(9.0 / 5.0, 3) and b["cublas"]["bytes"] == 2 * (2 * 16 * 64 + 2 * 40 * 16)
    assert b["cublas"]["copies"] == 4                                           # 20000 B / 6656 B per call, rounded up

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_match_and_time(tmp_path):
    from benchmarks.kernels import kda_gates as m
    res = m.run(tokens=(1,), a_tiles=((2, 1024, 4),), b_tiles=((32, 128, 4),), reps=20, out_paths=[tmp_path / "r.json"])
    assert res["checks_pass"] and res["best"]["1"]["triton"]["us"] > 0
