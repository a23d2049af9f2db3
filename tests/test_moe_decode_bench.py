"The batch-1 NVFP4 MoE benchmark script (benchmarks.kernels.moe_decode): its logic on the CPU, its GPU run when there is one."
import json, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "benchmarks.kernels.moe_decode"]   # run from the repository root

def test_no_gpu_exits_2_and_bad_flags_name_themselves():
    if torch.cuda.is_available(): pytest.skip("has a GPU")
    r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
    r = subprocess.run(SCRIPT + ["--down-tiles", "16y"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--down-tiles" in r.stderr

def test_bytes_per_expert_at_the_real_shapes():
    from benchmarks.kernels import moe_decode as m
    assert m.REAL == dict(E=320, K=4096, I=640, H=4096, topk=8)              # the real config at TP2
    b = m.expert_bytes(640, 4096, 4096)
    assert b == {"w13": 2 * (640 * (2048 + 256) + 8), "w2": 4096 * (320 + 40) + 8}   # codes + block scales + global scale
    assert 8 * (b["w13"] + b["w2"]) / 4.8e12 * 1e6 == pytest.approx(7.37, abs=0.01)   # one token's experts at 4.8 TB/s

def test_the_script_checks_every_decode_by_default():
    "The CPU tests below narrow `small_reads`; the GPU script itself runs the small cases of all three decodes."
    import inspect
    from benchmarks.kernels import moe_decode as m
    assert inspect.signature(m.run).parameters["small_reads"].default == m.READS == ("bytes", "words", "half2")

@pytest.mark.slow                                              # 161 s on 2 cores: CI runs it in its slow step
def test_run_on_cpu_under_the_interpreter(tmp_path, interpreted):
    "The whole script path (checks, per-kernel and joint timing, bytes, JSON) with small shapes, the interpreter, a fake timer."
    code = f"""
import json, sys
from benchmarks.kernels import moe_decode as m
calls = []
def timer(fns, reps):
    for f in fns: f()
    calls.append(len(fns)); return [3.0, 4.0, 2.0, 5.0, 5.0][(len(calls) - 1) % 5]   # per token count: the half2 gate_up tile wins
res = m.run(tokens=(1, 3), gate_up_tiles=((2, 64, 4, 1), (4, 32, 4, 2, 1), (2, 32, 4, 2, 1, 1)), down_tiles=((16, 32, 4, 3, 1, 1),), reps=1,
            out_paths=[{str(tmp_path / 'r.json')!r}], device="cpu", shapes=dict(E=6, K=64, I=32, H=48, topk=2),
            timer=timer, deadline_s=600, rotations=2, small_reads=("half2",))   # the chapter checks every read
print(json.dumps(calls))
"""
    out = interpreted(code)
    assert json.loads(out.strip().splitlines()[-1]) == [2] * 10                # every timing rotates 2 routings
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["gate"]["passed"] is True and res["gate"]["rule"]               # the writer's sanity gate
    assert len(res["checks"]) == 9                                              # 6 small (one decode) + 1 per decode at these shapes
    assert [c["read"] for c in res["checks"]] == ["half2"] * 6 + ["bytes", "words", "half2"]
    for c in res["checks"]:
        assert c["rel_rms"] < (2e-3 if c["read"] == "half2" else 1e-5) and c["rel_rms"] < c["bf16_h_rel_rms"], c
    assert [t["kernel"] for t in res["timings"]] == ["gate_up"] * 3 + ["down", "both"] * 1 + ["gate_up"] * 3 + ["down", "both"]
    assert not res["skipped"]
    per13, per2 = 2 * (32 * (32 + 4) + 8), 48 * (16 + 2) + 8                    # one expert's bytes at these shapes
    t = res["timings"][0]
    assert t["bytes"] == round(t["distinct_experts"] * per13) and t["distinct_experts"] == 2 and t["us"] == 3.0
    b = res["best"]["1"]
    assert b["gate_up"]["tile"] == [2, 32, 4, 2, 1, 1] and b["both"]["tiles"] == [[2, 32, 4, 2, 1, 1], [16, 32, 4, 3, 1, 1]]  # half2
    assert b["both"]["bytes"] == round(2 * (per13 + per2)) and res["best"]["3"]["both"]["distinct_experts"] <= 6
    assert res["best"]["3"]["gate_up"]["tile"] == [2, 32, 4, 2, 1, 1]

def test_check_ok_holds_each_decode_to_its_bound():
    from benchmarks.kernels import moe_decode as m
    assert m.check_ok({"read": "words", "rel_rms": 3e-7}) and not m.check_ok({"read": "bytes", "rel_rms": 2e-5})
    assert m.check_ok({"read": "half2", "rel_rms": 7e-4, "bf16_h_rel_rms": 2e-3})
    assert not m.check_ok({"read": "half2", "rel_rms": 1.5e-3, "bf16_h_rel_rms": 1e-3})    # worse than a bf16 intermediate
    assert not m.check_ok({"read": "half2", "rel_rms": 3e-3, "bf16_h_rel_rms": 5e-3})      # over the absolute bound

@pytest.mark.slow                                              # 28 s on 2 cores: CI runs it in its slow step
def test_shared_expert_contention_rows_on_cpu(tmp_path, interpreted):
    "`--shared`: per gate/up tile the routed pair, the shared expert (timed once), serial and two streams, in that order."
    code = f"""
import json, sys
from benchmarks.kernels import moe_decode as m
seq = iter([1.0, 2.0, 9.0, 30.0, 19.0, 25.0, 20.0, 8.0, 21.0, 16.0])   # main run (gate_up, down, both); then the rows
def timer(fns, reps):
    for f in fns: f()
    return next(seq)
res = m.run(tokens=(1,), gate_up_tiles=((2, 64, 4, 1),), down_tiles=((16, 32, 4, 3),), reps=1, out_paths=[{str(tmp_path / 'r.json')!r}],
            device="cpu", shapes=dict(E=6, K=64, I=32, H=48, topk=2), timer=timer, deadline_s=600, rotations=2, shared=True,
            shared_tiles=((2, 64, 4, 1), (4, 32, 4, 2)), small_reads=())
print(json.dumps(res["shared"]))
"""
    out = interpreted(code)
    a, b = json.loads(out.strip().splitlines()[-1])
    assert a["gate_up_tile"] == [2, 64, 4, 1] and a["down_tile"] == [16, 32, 4, 3]     # the main run's best down tile
    assert (a["shared_us"], a["routed_us"], a["serial_us"], a["two_streams_us"]) == (30.0, 19.0, 25.0, 20.0)
    assert a["overlap_gain_us"] == 5.0 and a["contention_us"] == -10.0
    assert (b["shared_us"], b["routed_us"], b["serial_us"], b["two_streams_us"]) == (30.0, 8.0, 21.0, 16.0)  # shared timed once
    assert b["overlap_gain_us"] == 5.0 and b["contention_us"] == -14.0
    assert json.loads((tmp_path / "r.json").read_text())["shared"] == [a, b]
    assert json.loads((tmp_path / "r.json").read_text())["gate"]["passed"] is True   # the writer's sanity gate

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_match_and_time(tmp_path):
    from benchmarks.kernels import moe_decode as m
    res = m.run(tokens=(1,), gate_up_tiles=((2, 512, 4, 3),), down_tiles=((16, 128, 4, 3),), reps=20, out_paths=[tmp_path / "r.json"])
    assert all(m.check_ok(c) for c in res["checks"]) and res["best"]["1"]["both"]["us"] > 0
