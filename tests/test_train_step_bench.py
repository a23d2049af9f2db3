"The training-step benchmark (benchmarks.kernels.train_step): its flags and sanity gate on the CPU; its run needs a GPU."
import subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "benchmarks.kernels.train_step"]

def test_no_gpu_exits_2():
    if torch.cuda.is_available(): pytest.skip("has a GPU")
    r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr

def test_gate_compares_every_run_with_the_first_at_the_first_and_last_step():
    from benchmarks.kernels.train_step import gate
    run = lambda k, losses: {"kernel": k, "losses": losses, "finite": all(x == x and abs(x) != float("inf") for x in losses)}
    ok = {"loss_rtol": 0.02, "runs": [run("torch", [3.0, 2.5, 2.0]), run("fla", [3.01, 9.9, 2.03]), run("torch", [3.0, 2.5, 2.0])]}
    assert gate(ok)                                                          # the middle step is not compared
    assert not gate({**ok, "runs": ok["runs"][:1]})                          # one run compares nothing
    assert not gate({**ok, "runs": [ok["runs"][0], run("fla", [3.0, 2.5, 2.1])]})      # 5 % off at the last step
    assert not gate({**ok, "runs": [ok["runs"][0], run("fla", [3.0, float("nan"), 2.0])]})
