"The MoE kernels' Nsight Compute profile (benchmarks.kernels.moe_profile, issue 28): its reading of ncu's raw CSV, on the CPU."
import csv, io, json, subprocess, sys
from pathlib import Path
import pytest
import torch

from benchmarks.kernels import moe_profile as mp

ROOT = Path(__file__).resolve().parents[1]


def raw_csv(launches):
    """An ncu `--page raw --csv` export: a line ncu prints first, the header, the units, one row per launch."""
    names = ["ID", "Kernel Name", "Grid Size", "Block Size", *mp.METRICS.values(),
             "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
             "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"]
    units = ["", "", "", "", "nsecond", "byte", "%", "%", "%", "sector", "request", "register/thread", "", "block", "%",
             "inst", "", "%", "inst", "inst"]
    f = io.StringIO(); w = csv.writer(f)
    w.writerow(["==PROF== Disconnected"]); w.writerow(names); w.writerow(units)
    for i, (kernel, dur, sectors) in enumerate(launches):
        vals = {v: "1" for v in mp.METRICS.values()}
        vals.update({mp.METRICS["duration"]: f"{dur:,}", mp.METRICS["ld_sectors"]: str(sectors), mp.METRICS["ld_requests"]: "100",
                     mp.METRICS["instructions"]: "2,000"})
        del vals[mp.METRICS["cycles_per_issue"]]                                 # a metric this ncu did not report
        w.writerow([str(i), kernel, "(80, 8, 1)", "(128, 1, 1)", *[vals.get(v, "") for v in mp.METRICS.values()], "7.5", "0.25"])
    return f.getvalue()


def test_the_raw_csv_reads_into_launches_with_sectors_per_request_and_stalls():
    out = mp.parse_raw_csv(raw_csv([("moe_gate_up_kernel", 20100, 400), ("moe_down_kernel", 9000, 800)]))
    assert [l["kernel"] for l in out] == ["moe_gate_up_kernel", "moe_down_kernel"]
    m = out[0]["metrics"]
    assert m["duration"] == 20100.0 and m["instructions"] == 2000.0 and m["sectors_per_request"] == 4.0
    assert m["cycles_per_issue"] is None and out[1]["metrics"]["sectors_per_request"] == 8.0
    assert out[0]["stalls"] == {"long_scoreboard": 7.5, "barrier": 0.25} and out[0]["units"]["duration"] == "nsecond"
    with pytest.raises(ValueError, match="Kernel Name"): mp.parse_raw_csv("a,b\n1,2\n")


def test_launches_are_labelled_in_the_childs_order_and_other_reports_refused():
    seq = [k for _ in (1, 8) for k in ("moe_gate_up_kernel", "moe_down_kernel", "marlin_gate_up_kernel", "marlin_down_kernel")]
    durs = {"moe_gate_up_kernel": 10, "moe_down_kernel": 5, "marlin_gate_up_kernel": 20, "marlin_down_kernel": 6}
    got = mp.label(mp.parse_raw_csv(raw_csv([(k, durs[k] * (1 + i // 4), 400) for i, k in enumerate(seq)])), (1, 8))
    assert [(l["tokens"], l["path"], l["role"]) for l in got[:4]] == [(1, "raw", "gate_up"), (1, "raw", "down"), (1, "marlin", "gate_up"), (1, "marlin", "down")]
    assert got[4]["tokens"] == 8
    q = mp.ratios(got)
    assert q["1"]["marlin:gate_up"]["duration"] == 2.0 and q["8"]["marlin:down"]["duration"] == 1.2
    assert q["1"]["marlin:gate_up"]["sectors_per_request"] == 1.0
    assert q["1"]["marlin:gate_up"]["cycles_per_issue"] is None                  # absent in both: no ratio, no crash
    with pytest.raises(ValueError, match="not"):                               # a launch missing (the report cut short)
        mp.label(mp.parse_raw_csv(raw_csv([(k, 1, 1) for k in seq[:-1]])), (1, 8))
    three = seq[:4] + seq[2:4]                                                  # with the packed-fp16 path: its launches after Marlin's
    got = mp.label(mp.parse_raw_csv(raw_csv([(k, 1 + i, 400) for i, k in enumerate(three)])), (1,), mp.PATHS)
    assert [l["path"] for l in got] == ["raw", "raw", "marlin", "marlin", "marlin_h2", "marlin_h2"]
    assert mp.ratios(got)["1"]["marlin_h2:gate_up"]["duration"] == 5.0
    with pytest.raises(ValueError, match="not"):                               # the raw path's kernels where Marlin's belong
        mp.label(mp.parse_raw_csv(raw_csv([(k, 1, 1) for k in seq[:2] * 3])), (1,), mp.PATHS)


def test_the_gate_needs_right_outputs_both_paths_and_the_launches():
    ok = {"tokens": [1], "paths": ["raw", "marlin"], "checks": [{"finite": True, "rel_rms": 1e-6}] * 2, "launches": [{}], "errors": []}
    assert not mp.gate({**ok, "paths": list(mp.PATHS)})                          # a path unchecked
    assert mp.gate(ok)
    assert not mp.gate({**ok, "checks": [{"finite": True, "rel_rms": 0.5}, {"finite": True, "rel_rms": 1e-6}]})
    assert not mp.gate({**ok, "checks": ok["checks"][:1]}) and not mp.gate({**ok, "launches": []})
    assert not mp.gate({**ok, "errors": ["ncu run failed"]})


def test_no_gpu_exits_2_and_token_counts_past_the_decode_range_name_the_flag():
    r = subprocess.run([sys.executable, "-m", "benchmarks.kernels.moe_profile", "--tokens", "1,16"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--tokens" in r.stderr and "[16]" in r.stderr
    if torch.cuda.is_available(): return
    r = subprocess.run([sys.executable, "-m", "benchmarks.kernels.moe_profile"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr


def test_prepare_checks_every_path_and_binds_each_calls_inputs(interpreted):
    """moe_profile.prepare under Triton's interpreter at small shapes (Marlin's copy by `from_experts`, as the chapter's
    checks build it): every path of every token count is right against fp32, and each profiled call keeps its own token
    count's inputs (they run after the loop, so a call that read the loop's variables would compute the last count's)."""
    out = interpreted("""
import json
from benchmarks.kernels.moe_profile import PATHS, prepare
from solar_open2.vllm.ops import moe_marlin as mm
from solar_open2.vllm.ops.moe_decode import NVFP4Experts
copies = lambda w13, w2: (mm.from_experts(NVFP4Experts(w13.packed, w13.scale, w13.global_scale), segments=2),
                          mm.from_experts(w2, pad_inner=True))
res, calls = prepare((1, 2), PATHS, device="cpu", shapes=dict(E=4, K=64, I=64, H=64, topk=2), copies=copies)
print(json.dumps([res["checks"], [[fn().shape[0] for _, fn in one] for one in calls]]))""")
    checks, rows = json.loads(out.strip().splitlines()[-1])
    assert len(checks) == 6 and all(c["finite"] and c["rel_rms"] < 1e-2 for c in checks), checks
    assert rows == [[1, 1, 1], [2, 2, 2]]
