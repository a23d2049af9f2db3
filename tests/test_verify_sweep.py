"benchmarks.engine.verify_sweep: the verify step against k, each k over its own job's plain step and its floor in bytes."
import json, math, os, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.engine import verify_sweep as vs  # noqa: E402
from solar_open2 import budget  # noqa: E402
from solar_open2.config import SolarOpen2Config  # noqa: E402

FIG = "decode_bs1_ctx2048"

def variant(ms, frac=None, gated=False, **settings):
    f = {"value_tok_s": 1e3 / ms, "fraction_of_roofline": frac or 0.5, "itl_median_ms": ms, "acceptance": settings.pop("acc", None)}
    return {"status": "complete", "settings": {"config": "rank", "tp": 1, "decode_tokens": 256, **settings},
            "figures": {FIG: f}, "gated_out": [FIG] if gated else []}

def summary(**variants):
    return {"baseline": next(iter(variants)), "variants": variants}

def test_rows_hold_each_k_against_its_own_baseline_and_the_budget_floor(tmp_path):
    """Each speculative variant's step over its summary's plain step, its floor (verify_bytes / decode_bytes at the
    context perf uses), its roofline time at the bandwidth the baseline's figure implies; the variants that are not
    one verify a step (gated out, drafts accepted, ngram unpadded, no figure) are left out with the reason."""
    a = summary(k0=variant(6.0, 0.476), k1=variant(9.0, ngram=1, spec_pad_drafts=True, acc=0.0),
                k3=variant(12.0, ngram=3, spec_pad_drafts=True, acc=0.0), bad=variant(10.0, gated=True, ngram=2, spec_pad_drafts=True),
                acc=variant(7.0, ngram=3, spec_pad_drafts=True, acc=0.4), unpadded=variant(50.0, ngram=3),
                gone={"status": "failed", "error": "CUDA out of memory", "settings": {"draft_head": 7}, "figures": {}})
    b = summary(base=variant(6.6, 0.476), d7=variant(20.0, draft_head=7, acc=0.0))
    (tmp_path / "a.json").write_text(json.dumps(a)); (tmp_path / "b.json").write_text(json.dumps(b))
    res = vs.sweep([tmp_path / "a.json", tmp_path / "b.json"])
    got = [(r["k"], r["variant"], round(r["step_over_k0"], 4)) for r in res["rows"]]
    assert got == [(0, "k0", 1.0), (0, "base", 1.0), (1, "k1", 1.5), (3, "k3", 2.0), (7, "d7", round(20 / 6.6, 4))], got
    assert sorted(s["variant"] for s in res["skipped"]) == ["acc", "bad", "gone", "unpadded"]
    why = {s["variant"]: s["why"] for s in res["skipped"]}
    assert "sanity gate" in why["bad"] and "40%" in why["acc"] and "not padded" in why["unpadded"] and "out of memory" in why["gone"]
    cfg, ctx = budget.rank_config(SolarOpen2Config.real(), 2), 2048 + 128
    k3 = next(r for r in res["rows"] if r["k"] == 3)
    floor = budget.verify_bytes(cfg, 1, ctx, 4) / budget.decode_bytes(cfg, 1, ctx)
    assert math.isclose(k3["floor"], floor) and math.isclose(k3["floor_ms"], 6.0 * floor)
    bw = (1e3 / 6.0) / 0.476 * budget.decode_bytes(cfg, 1, ctx)                # the bandwidth the baseline's roofline used
    assert math.isclose(k3["roofline_ms"], budget.verify_bytes(cfg, 1, ctx, 4) / bw * 1e3)
    assert res["target"] == {"k": 3, "target_ratio": 1.3, "measured_ratio": 2.0, "floor": floor, "met": False, "reachable": False}
    fig = vs.plot(res, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 0 and len(fig.axes[0].lines) >= 4

def test_a_speculating_baseline_or_no_rows_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="baseline 'k3' speculates"):
        vs.sweep_rows(summary(k3=variant(12.0, ngram=3, spec_pad_drafts=True)), "x.json")
    p = tmp_path / "only.json"
    p.write_text(json.dumps(summary(k0=variant(6.0), k3=variant(9.0, gated=True, ngram=3, spec_pad_drafts=True))))
    r = subprocess.run([sys.executable, "-m", "benchmarks.engine.verify_sweep", str(p), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "left out k3" in r.stdout and (tmp_path / "o" / "verify_sweep.json").exists(), r.stderr
    res = json.loads((tmp_path / "o" / "verify_sweep.json").read_text())
    assert [x["k"] for x in res["rows"]] == [0] and res["target"] is None and res["command"].startswith("python -m benchmarks.engine.verify_sweep")
