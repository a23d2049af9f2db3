"The dense-GEMV benchmark script (benchmarks.kernels.gemv): shapes from the config, its logic on the CPU, its GPU run."
import json, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "benchmarks.kernels.gemv"]   # run from the repository root

def test_shapes_are_the_real_per_rank_projections_and_their_bytes_match_the_budget():
    from benchmarks.kernels import gemv as g
    from solar_open2 import budget
    from solar_open2.config import SolarOpen2Config
    cfg = SolarOpen2Config.real()
    s = {x["name"]: x for x in g.dense_shapes(cfg)}
    assert (s["kda.qkvb_proj"]["N"], s["kda.o_proj"]["K"], s["gqa.qkv_proj"]["N"], s["router"]["N"]) == (12320, 4096, 5120, 320)
    assert sum(x["per_step"] for x in s.values() if x["name"].startswith("kda")) == 5 * 36 and s["lm_head"]["per_step"] == 1
    step = sum(x["per_step"] * x["N"] * x["K"] * (4 if x["dtype"] == "float32" else 2) for x in s.values())
    p = budget.decode_bytes(cfg, 2, 2048, by_part=True)
    dense = p["gqa_proj"] + p["kda_proj"] + p["shared_expert"] + p["router"] + p["lm_head"]
    assert abs(step - dense) / dense < 0.01, (step, dense)       # the budget's dense bytes per step, within its small extras

def test_no_gpu_exits_2_and_bad_flags_name_themselves():
    if torch.cuda.is_available(): pytest.skip("has a GPU")
    r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
    r = subprocess.run(SCRIPT + ["--methods", "cublas,fast"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--methods" in r.stderr

def test_run_on_cpu_under_the_interpreter(tmp_path, interpreted):
    "Checks, timing loop, weight copies, per-step totals and JSON, with small shapes, Triton's interpreter, a fake timer."
    code = f"""
import json, sys
from benchmarks.kernels import gemv as g
calls = []
def timer(fns, reps):                     # every call made once; 99, 98, 97, ...: a later tile is the faster one
    for f in fns: f()
    calls.append(len(fns)); return 100.0 - len(calls)
shapes = [dict(name="a", N=40, K=64, dtype="bfloat16", per_step=3), dict(name="r", N=24, K=32, dtype="float32", per_step=2)]
res = g.run(tokens=(1, 3), methods=("cublas", "triton"), tiles=((16, 32, 4, 1), (32, 64, 4, 2)), reps=1, deadline_s=600,
            out_paths=[{str(tmp_path / 'r.json')!r}], device="cpu", shapes=shapes, l2_bytes=20000, max_copies=4,
            timer=timer)
"""
    out = interpreted(code)
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["gate"]["passed"] is True and res["gate"]["rule"]               # the writer's sanity gate
    assert not [t for t in res["timings"] if "error" in t] and not res["skipped"]
    assert all(c["rel_err"] < (1e-5 if c["shape"] == "r" else 2e-2) for c in res["checks"]) and len(res["checks"]) == 12
    a1 = [t for t in res["timings"] if t["tokens"] == 1 and t["shape"] == "a"]
    assert [t["method"] for t in a1] == ["cublas", "triton", "triton"] and a1[0]["copies"] == 4   # 20 kB / 5,120 B -> 4
    assert [t["copies"] for t in res["timings"] if t["shape"] == "r"][0] == 4                     # capped at max_copies
    best = [t for t in res["timings"] if t.get("best_of_method")]
    assert len(best) == 2 * 2 * 2                                                                # tokens x shapes x methods
    assert all(t["tile"] == [32, 64, 4, 2] for t in best if t["method"] == "triton")             # the faster tile, not the first
    # timer calls in order: cublas M1 a, r (99, 98), M3 a, r (97, 96); triton M1 a (95, 94), r (93, 92), M3 a (91, 90), r (89, 88)
    assert res["step_us"] == {"cublas_M1": 3 * 99 + 2 * 98, "cublas_M3": 3 * 97 + 2 * 96,
                              "triton_M1": 3 * 94 + 2 * 92, "triton_M3": 3 * 90 + 2 * 88}
    assert res["step_bytes"] == 3 * 40 * 64 * 2 + 2 * 24 * 32 * 4

def test_fma_method_on_cpu_under_the_interpreter(tmp_path, interpreted):
    """`fma` (the ops' `gemv_fma_kernel`): bf16 and fp32 weights checked against fp64, its own tiles, the faster one
    kept; the kernels import nothing of vLLM, so a GPU machine without vLLM runs the benchmark as it is."""
    code = f"""
import json, sys
from benchmarks.kernels import gemv as g
n = [0]
def timer(fns, reps):
    for f in fns: f()
    n[0] += 1; return 10.0 - n[0]                  # the later tile is the faster one
shapes = [dict(name="a", N=40, K=64, dtype="bfloat16", per_step=3), dict(name="r", N=24, K=32, dtype="float32", per_step=2)]
res = g.run(tokens=(1, 5), methods=("fma",), fma_tiles=((2, 32, 4), (4, 64, 4, 2)), reps=1, deadline_s=600,
            out_paths=[{str(tmp_path / 'r.json')!r}], device="cpu", shapes=shapes, l2_bytes=4000, max_copies=2, timer=timer)
print(json.dumps(sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))))
"""
    out = interpreted(code)
    assert json.loads(out.strip().splitlines()[-1]) == []                       # vLLM never imported
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["gate"]["passed"] is True and res["gate"]["rule"]               # the writer's sanity gate
    assert not [t for t in res["timings"] if "error" in t] and len(res["checks"]) == 8
    assert all(c["rel_err"] < (1e-6 if c["shape"] == "r" else 2e-2) for c in res["checks"])   # fp32: exact sums
    assert all(t["tile"] == [4, 64, 4, 2] for t in res["timings"] if t.get("best_of_method"))
    assert res["fma_tiles"] == [[2, 32, 4], [4, 64, 4, 2]] and set(res["step_us"]) == {"fma_M1", "fma_M5"}

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_methods_match_and_time(tmp_path):
    from benchmarks.kernels import gemv as g
    res = g.run(tokens=(1,), methods=("cublas", "triton"), tiles=((16, 256, 4, 3),), reps=5, out_paths=[tmp_path / "r.json"])
    assert not [t for t in res["timings"] if "error" in t] and set(res["step_us"]) == {"cublas_M1", "triton_M1"}
