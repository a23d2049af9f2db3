"The MoE routing benchmark (benchmarks.kernels.moe_router): its logic on the CPU, its GPU run when there is one."
import json, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "benchmarks.kernels.moe_router"]   # run from the repository root

def test_no_gpu_exits_2_and_bad_flags_name_themselves():
    if torch.cuda.is_available(): pytest.skip("has a GPU")
    r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
    r = subprocess.run(SCRIPT + ["--tiles", "4y"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--tiles" in r.stderr

def test_real_shapes():
    from benchmarks.kernels import moe_router as m
    from solar_open2.config import SolarOpen2Config
    assert m.real_shapes(SolarOpen2Config.real()) == dict(E=320, K=4096, top_k=8)

def test_the_script_runs_the_small_cases_by_default():
    "test_pairs_option_on_cpu turns the small cases off; the GPU script runs them."
    import inspect
    from benchmarks.kernels import moe_router as m
    assert inspect.signature(m.run).parameters["small_checks"].default is True

@pytest.mark.slow                                              # 91 s on 2 cores: CI runs it in its slow step
def test_run_on_cpu_under_the_interpreter(tmp_path, interpreted):
    "The whole script path (checks against the definition and vLLM's CPU path, timings, JSON) at small shapes, a fake timer."
    code = f"""
import json, sys
from benchmarks.kernels import moe_router as m
n = [0]
def timer(fns, reps):
    for f in fns: f()
    n[0] += 1
    return {{1: 9.0, 2: 6.0, 0: 4.0}}[n[0] % 3]             # per token count: vllm 9, then the two tiles (the 2nd faster)
res = m.run(tokens=(1, 3), tiles=((4, 64, 4, 1), (8, 32, 2, 1)), reps=1, out_paths=[{str(tmp_path / 'r.json')!r}],
            device="cpu", shapes=dict(E=40, K=96, top_k=4), timer=timer, deadline_s=600, l2_bytes=40000)
print(json.dumps(n[0]))
"""
    out = interpreted(code)
    assert json.loads(out.strip().splitlines()[-1]) == 6                  # 3 timings per token count
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["gate"]["passed"] is True and res["gate"]["rule"]               # the writer's sanity gate
    assert res["checks_pass"] and res["counters_zero"]
    for c in res["checks"]:
        assert c["ids_equal_torch"] and c["ids_equal_vllm"] and c["max_dw_vllm"] < 1e-6, c   # vLLM's torch path on the CPU
    assert [t["kernel"] for t in res["timings"]] == ["vllm", "kernel", "kernel"] * 2
    b = res["best"]["3"]
    assert b["kernel"]["tile"] == [8, 32, 2, 1] and b["speedup"] == round(9.0 / 4.0, 3)
    assert b["vllm"]["copies"] == 3 and b["vllm"]["bytes"] == 4 * 40 * 96  # 40000 B / 15360 B per call, rounded up

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernel_matches_and_times(tmp_path):
    from benchmarks.kernels import moe_router as m
    res = m.run(tokens=(1,), reps=20, out_paths=[tmp_path / "r.json"])
    assert res["checks_pass"] and res["counters_zero"] and res["best"]["1"]["kernel"]["us"] > 0

@pytest.mark.slow                                              # 59 s on 2 cores: CI runs it in its slow step
def test_pairs_option_on_cpu(tmp_path, interpreted):
    "--pairs: the pairs the kernel writes are checked against 08f's act_pairs_triton and timed as a row of their own."
    code = f"""
import json, sys
from benchmarks.kernels import moe_router as m
res = m.run(tokens=(2,), tiles=((4, 64, 4, 1),), reps=1, out_paths=[{str(tmp_path / 'r.json')!r}], device="cpu",
            shapes=dict(E=40, K=96, top_k=4), timer=lambda fns, reps: [f() for f in fns] and 3.0, deadline_s=600,
            l2_bytes=1, pairs=True, small_checks=False)   # the small cases: test_run_on_cpu_under_the_interpreter
print(json.dumps(res["checks_pass"]))
"""
    assert json.loads(interpreted(code).strip().splitlines()[-1]) is True
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["gate"]["passed"] is True and res["gate"]["rule"]               # the writer's sanity gate
    assert [c["pairs_equal"] for c in res["checks"] if c.get("kind") == "pairs"] == [True]
    assert [t["kernel"] for t in res["timings"]] == ["vllm", "kernel", "kernel+pairs"]
