"The batched NVFP4 MoE benchmark (benchmarks.kernels.moe_batch, issue 28): its logic on the CPU, its flags."
import json, subprocess, sys
from pathlib import Path
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "-m", "benchmarks.kernels.moe_batch"]

def test_no_gpu_exits_2_and_bad_tiles_name_the_flag():
    if torch.cuda.is_available(): pytest.skip("has a GPU")
    r = subprocess.run(SCRIPT, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
    r = subprocess.run(SCRIPT + ["--tiles", "16x64x128x4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--tiles" in r.stderr and "5 numbers" in r.stderr

def test_the_plain_align_sorts_pairs_by_expert_in_padded_blocks():
    "`align_torch`, what vLLM's moe_align_block_size returns: each expert's pairs in runs padded to the block, pad id M·k."
    from benchmarks.kernels.moe_batch import align_torch
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])                               # 3 tokens, top-2: pairs 0..5
    s, e, n = align_torch(ids, 2, 4)
    assert s.tolist() == [1, 4, 3, 6, 0, 2, 5, 6] and e.tolist() == [0, 1, 2, 2] and n.tolist() == [8]

def test_peaks_by_gpu_name():
    from benchmarks.engine.perf.figures import gpu_peaks
    assert gpu_peaks("NVIDIA H100 80GB HBM3") == (3.35e12, 989.4e12, "h100") and gpu_peaks("NVIDIA H200") == (4.8e12, 989.4e12, "h200")
    assert gpu_peaks("NVIDIA A100-SXM4-80GB") == (4.8e12, 989.4e12, None)       # not in the table: the H200's

@pytest.mark.slow
def test_run_on_cpu_under_the_interpreter(tmp_path, interpreted):
    """The script's path on small shapes under Triton's interpreter: vLLM's emulation kernel over the raw layout, split
    and fused gate|up, each tile and the decode kernels checked against the fp32 version, timings with a fake timer,
    the JSON gated."""
    code = f"""
import json, os, torch
os.environ["CUDA_VISIBLE_DEVICES"] = ""    # vLLM keeps real Triton with no active driver only then (else its placeholder)
from benchmarks.kernels import moe_batch as m
calls = []
def timer(fns, reps):
    for f in fns: f()
    calls.append(len(fns)); return 10.0 - len(calls) % 3
cfg = lambda M, w13, w2, k: {{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}}
res = m.run(tokens=(2, 9), tiles=((16, 32, 64, 4, 2),), reps=1, out_paths=[{str(tmp_path / 'r.json')!r}], device="cpu",
            shapes=dict(E=6, K=64, I=32, H=48, topk=2), timer=timer, rotations=2, align=m.align_torch, marlin=False,
            default_cfg=cfg, dtype=torch.float32)     # the interpreter has no bf16 dot
print(json.dumps(calls))
"""
    out = interpreted(code)
    assert json.loads(out.strip().splitlines()[-1]) == [2] * 5                 # 2 tokens: 3 paths; 9 tokens: no decode
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["gate"]["passed"] is True
    assert [(c["tokens"], c["path"]) for c in res["checks"]] == [(2, "grouped_default"), (2, "grouped"), (2, "decode"),
                                                                 (9, "grouped_default"), (9, "grouped")]
    assert all(c["rel_rms"] < 1e-2 for c in res["checks"]), res["checks"]
    assert set(res["best"]["2"]) == {"grouped_default", "grouped", "decode"} and "marlin" not in res["best"]["9"]
    t = res["timings"][0]
    assert t["bytes"] == round(t["distinct_experts"] * (2 * (32 * (32 + 4) + 8) + 48 * (16 + 2) + 8)) and not res["errors"]

def test_a_failed_or_missing_check_withholds_the_summary(tmp_path):
    "The gate: a path off the fp32 version (or not finite) or no check at all, and `best` is withheld from the JSON."
    from benchmarks.common import json_writer
    from benchmarks.kernels import moe_batch as m
    ok = {"tokens": 2, "path": "grouped", "rel_rms": 4e-3, "finite": True}
    for checks, passed in (([ok], True), ([ok, {**ok, "rel_rms": 0.5}], False), ([ok, {**ok, "finite": False}], False), ([], False)):
        res = {"checks": checks, "best": {"2": {"grouped": {"us": 1.0}}}}
        json_writer(res, [tmp_path / "r.json"], m.gate, m.GATE_RULE)()
        got = json.loads((tmp_path / "r.json").read_text())
        assert got["gate"]["passed"] is passed and ("best" in got) is passed and ("withheld" in got) is not passed


def test_marlin_tiles_parse_and_the_sweep_holds_one_side():
    """moe_batch --marlin-tiles: GxKTxWARPSxSTAGES[xFORM] pairs become MarlinTiles (FORM 3: the scale bytes loaded per
    word; 2 or none: per column; 0, 1, recorded on 2026-12-07, name removed forms and are refused); a malformed pair is
    refused; the default sweep varies one kernel's tile with the other's held, and times the packed-fp16 forms (FORM 4)."""
    pytest.importorskip("triton")
    from benchmarks.kernels import moe_batch as mb
    from solar_open2.vllm.ops.moe_marlin import MarlinTile
    assert mb.marlin_tile((2, 8, 4, 2)) == MarlinTile(2, 8, 4, 2) == mb.marlin_tile((2, 8, 4, 2, 2))
    assert mb.marlin_tile((2, 8, 4, 2, 3)) == MarlinTile(2, 8, 4, 2, word_scales=True)
    assert mb.marlin_tile((2, 8, 4, 2, 4)) == MarlinTile(2, 8, 4, 2, half2=True)
    with pytest.raises(ValueError, match="removed"):
        mb.marlin_tile((1, 64, 4, 2, 1))
    plain = [p for p in mb.MARLIN_TILES if len(p[0]) == 4]
    held = [p for p in plain if p[1] == mb._D0] + [p for p in plain if p[0] == mb._G0]
    assert len(held) == len(plain) + 1 and len(plain) >= 12                     # the held pair appears in both halves
    assert {mb.marlin_tile(p[0]).half2 for p in mb.MARLIN_TILES} == {False, True}     # packed fp16 is swept: gate/up alone,
    assert any(mb.marlin_tile(p[1]).half2 for p in mb.MARLIN_TILES)                   # and with down
    for bad in ("1x64x4/2x8x4x2", "1x64x4x2x1/2x8x4x2", "1x64x4x2/2x8x4x2x5"):
        with pytest.raises(SystemExit):
            mb.main(["--marlin-tiles", bad, "--out", "/nonexistent"])


def test_marlin_rows_take_the_fastest_pair_per_count_and_refuse_a_failed_gate():
    """moe_batch.marlin_rows: the table rows a result measured (the best marlin_decode pair per token count), printed as
    MARLIN_TILES' literal; a result whose gate failed gives no table."""
    pytest.importorskip("triton")
    from benchmarks.kernels import moe_batch as mb
    from solar_open2.vllm.ops.moe_marlin import MarlinTile
    best = {"8": {"marlin_decode": {"config": {"gate_up": [2, 16, 4, 2, 2], "down": [1, 8, 4, 2, 2]}}},
            "1": {"marlin_decode": {"config": {"gate_up": [1, 32, 4, 2], "down": [1, 8, 4, 2]}}, "marlin": {"config": None}},
            "32": {"marlin": {"config": None}}}
    rows = mb.marlin_rows({"gate": {"passed": True}, "best": best})
    assert rows == [(1, MarlinTile(1, 32, 4, 2), MarlinTile(1, 8, 4, 2)), (8, MarlinTile(2, 16, 4, 2), MarlinTile(1, 8, 4, 2))]
    assert eval(mb.rows_literal(rows), {"MarlinTile": MarlinTile}) == tuple(rows)
    with pytest.raises(ValueError, match="gate"):
        mb.marlin_rows({"gate": {"passed": False}, "best": best})


def test_main_prints_the_rows_a_passed_run_measured_and_none_for_a_failed_one(tmp_path, monkeypatch, capsys):
    """moe_batch.main prints `MARLIN_TILES rows measured:` from the gated result, as the file holds it. The H100 run of
    2026-12-07 printed none: `run` returns the result without its gate (the writer adds it), and main read that."""
    pytest.importorskip("triton")
    from benchmarks.kernels import moe_batch as mb
    best = {1: {"marlin": {"us": 42.0, "config": None},
                "marlin_decode": {"us": 41.0, "config": {"gate_up": [1, 64, 4, 2], "down": [1, 8, 4, 2]}}}}
    good = {"checks": [{"finite": True, "rel_rms": 1e-7}], "best": best}
    monkeypatch.setattr(mb, "result_paths", lambda *a: [tmp_path / "moe_batch.json"])
    monkeypatch.setattr(mb, "run", lambda *a, **k: dict(good))
    assert mb.main([]) == 0
    out = capsys.readouterr().out
    assert "MARLIN_TILES rows measured: ((1, MarlinTile(groups=1, k_tiles=64" in out and "CHECK FAILED" not in out
    monkeypatch.setattr(mb, "run", lambda *a, **k: {**good, "checks": [{"finite": False, "rel_rms": 1e-7}]})
    assert mb.main([]) == 0
    out = capsys.readouterr().out
    assert "CHECK FAILED" in out and "rows measured" not in out and "tokens:" not in out   # a failed gate: no figures printed
