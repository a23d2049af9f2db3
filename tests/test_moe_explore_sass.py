"""benchmarks/moe_explore/e4m3_sass.py runs without a GPU: its E4M3 byte formula and its instruction counts."""
import sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "moe_explore"))

def test_e4m3_bytes_decode_to_the_e2m1_values_times_2_to_the_minus_6():
    pytest.importorskip("triton")
    import e4m3_sass as es
    assert es.e4m3_formula_check() == {"codes": True, "bytes_of_two_codes": True}

def test_the_hardware_decodes_take_fewer_instructions_than_dot16():
    pytest.importorskip("triton")
    import e4m3_sass as es
    d90, e90 = es.loop_sass("dot16", 90), es.loop_sass("e4m3", 90)
    assert "F2FP.F16.E4M3.UNPACK_B" in e90["ops"] and "F2FP.F16.E4M3.UNPACK_B" not in d90["ops"]
    assert e90["decode_and_fma_per_block"] < 0.9 * d90["decode_and_fma_per_block"]
    b120 = es.loop_sass("e2m1x2", 120)
    assert b120["ops"].get("F2FP.F16.E2M1.UNPACK_B") == 8 * b120["blocks_per_thread"]    # one per byte of two codes
    assert b120["decode_and_fma_per_block"] < 0.5 * d90["decode_and_fma_per_block"]
    with pytest.raises(Exception, match="e2m1x2"): es.loop_sass("e2m1x2", 90)         # not on Hopper
