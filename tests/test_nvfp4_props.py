"""Property tests (hypothesis) of the NVFP4 codec `solar_open2.nvfp4`, over shapes and value ranges.

The oracles here are independent of the code under test: the nearest-value search is a brute force over the 16
grid values, and the scale relations are algebraic facts (powers of two commute with every rounding step).
"""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from solar_open2.nvfp4 import (CONVENTIONS, E2M1_VALUES, GROUP_SIZE, SUFFIXES, NVFP4Weight, fake_quantize_activation,
                               from_checkpoint, global_scale_for, pack_codes, quantize, round_to_e2m1, to_checkpoint,
                               unpack_codes)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def weights(draw, max_out=8, max_blocks=8):
    "A random [out, in] fp32 matrix: Gaussian rows at a random magnitude, some blocks zeroed or rescaled."
    out = draw(st.integers(1, max_out))
    nb = draw(st.integers(1, max_blocks))
    seed = draw(st.integers(0, 2**31 - 1))
    log_mag = draw(st.floats(-6, 6))
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, nb, GROUP_SIZE, generator=g) * 10.0 ** log_mag          # [out, nb, 16]
    w *= 10.0 ** (torch.rand(out, nb, 1, generator=g) * 4 - 2)                  # blocks at different scales
    if draw(st.booleans()): w[torch.rand(out, nb, generator=g) < 0.2] = 0.0       # zero blocks
    return w.reshape(out, nb * GROUP_SIZE)


def _nearest_code(y: float) -> int:
    "Brute force: the grid value nearest to y (saturating), ties to the even code, sign from y's sign bit."
    best, best_d = None, None
    for c in range(8):
        d = abs(min(abs(y), 6.0) - E2M1_VALUES[c].item())
        if best is None or d < best_d or (d == best_d and c % 2 == 0 and best % 2 == 1):
            best, best_d = c, d
    return best | (8 if math.copysign(1.0, y) < 0 else 0)


def _eff(q: NVFP4Weight) -> torch.Tensor:
    return (q.scale.float() * q.global_scale).repeat_interleave(GROUP_SIZE, dim=1)   # [out, in]


@SETTINGS
@given(weights())
def test_codes_are_nearest_grid_values(w):
    q = quantize(w)
    eff = _eff(q)
    codes = unpack_codes(q.packed)
    y = torch.where(eff > 0, w / eff, w * 0.0)
    got, want = codes.flatten().tolist(), [_nearest_code(v) for v in y.flatten().tolist()]
    assert got == want


@SETTINGS
@given(weights())
def test_error_at_most_one_effective_scale(w):
    q = quantize(w)
    err = (q.dequantize(torch.float32) - w).abs()
    bamax = w.abs().reshape(w.shape[0], -1, GROUP_SIZE).amax(-1).repeat_interleave(GROUP_SIZE, 1)
    # half the largest grid step (4 -> 6) is one effective scale; a block whose scale underflowed stores zeros
    assert (err <= _eff(q) * (1 + 1e-6) + (_eff(q) == 0) * bamax).all()
    # and the global multiplier maps amax onto 448 * 6
    amax = w.abs().max().item()
    if amax > 0:
        assert math.isclose(q.global_scale.item() * 448 * 6, amax, rel_tol=1e-6)
        assert q.scale.float().max().item() == 448.0


@SETTINGS
@given(weights(), st.integers(-20, 20))
def test_power_of_two_scaling_commutes(w, k):
    q, q2 = quantize(w), quantize(w * 2.0 ** k)
    assert torch.equal(q.packed, q2.packed)
    assert torch.equal(q.scale.view(torch.uint8), q2.scale.view(torch.uint8))
    if w.abs().max() > 0:
        assert q2.global_scale.item() == q.global_scale.item() * 2.0 ** k
        assert torch.equal(q2.dequantize(torch.float32), q.dequantize(torch.float32) * 2.0 ** k)


@SETTINGS
@given(weights())
def test_negation_flips_only_sign_bits(w):
    q, qn = quantize(w), quantize(-w)
    assert torch.equal(qn.packed, q.packed ^ 0x88)
    assert torch.equal(qn.scale.view(torch.uint8), q.scale.view(torch.uint8))


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_pack_unpack_roundtrip(rows, half, seed):
    codes = torch.randint(0, 16, (rows, 2 * half), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    packed = pack_codes(codes)
    assert packed.shape == (rows, half)
    assert torch.equal(packed & 0xF, codes[:, 0::2]) and torch.equal(packed >> 4, codes[:, 1::2])
    assert torch.equal(unpack_codes(packed), codes)


@SETTINGS
@given(weights(), st.floats(1e-3, 1e3))
def test_conventions_roundtrip_bit_exact(w, input_amax):
    q = quantize(w, input_amax=input_amax)
    deq = {}
    for c in CONVENTIONS:
        t = to_checkpoint(q, c)
        assert list(t) == list(SUFFIXES[c])
        b = from_checkpoint(t, c, "m")
        assert torch.equal(b.packed, q.packed) and torch.equal(b.scale.view(torch.uint8), q.scale.view(torch.uint8))
        assert b.global_scale.item() == q.global_scale.item()
        assert b.input_global_scale.item() == q.input_global_scale.item()
        deq[c] = b.dequantize(torch.bfloat16)
    assert torch.equal(deq["compressed-tensors"], deq["modelopt"])
    ct = to_checkpoint(q, "compressed-tensors")
    # the compressed-tensors divisor is the reciprocal of the multiplier (vLLM inverts it on load)
    assert (1.0 / ct["weight_global_scale"]).item() == q.global_scale.item()


@SETTINGS
@given(st.floats(1e-30, 1e30))
def test_global_multiplier_survives_the_divisor(amax):
    m = global_scale_for(amax)
    assert m.dtype == torch.float32 and m.shape == ()
    assert (1.0 / (1.0 / m)).item() == m.item()


@SETTINGS
@given(weights(max_out=4), st.floats(0.1, 10.0))
def test_activation_fake_quant_idempotent_and_bounded(x, amax_factor):
    g = global_scale_for(x.abs().max() * amax_factor)
    fq = fake_quantize_activation(x, g)
    assert fq.shape == x.shape and fq.dtype == x.dtype
    assert torch.equal(fake_quantize_activation(fq, g), fq)
    # each 16-block keeps its own dynamic scale s (its FP8 block scale times the global scale). A value within the
    # grid (|x| <= 6 s) is off by at most one s (half the widest gap, 4 -> 6); a larger one saturates at 6 s. The
    # second case is real: when the block scale falls into FP8's subnormal range (a block of small values under a
    # global scale set by a large one), rounding the scale down can leave the block's max above 6 s.
    blocks = x.reshape(x.shape[0], -1, GROUP_SIZE)
    amax = blocks.abs().amax(-1)
    eff = (amax / 6 / g).clamp(max=448).to(torch.float8_e4m3fn).float() * g
    err = (fq - x).abs().reshape(blocks.shape)
    bound = torch.maximum(eff, amax - 6 * eff)            # per block: rounding step, or the saturation overshoot
    ok = (err <= bound.unsqueeze(-1) * (1 + 1e-6) + (eff == 0).unsqueeze(-1) * blocks.abs()).all(-1)
    assert ok.all()


def test_round_to_e2m1_ties_hand_written():
    y = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 0.2500001, 100.0, -0.0])
    assert round_to_e2m1(y).tolist() == [0, 2, 2, 4, 4, 6, 6, 8, 14, 1, 7, 8]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_bit_for_bit():
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(3)) * 0.02
    q, qc = quantize(w, input_amax=3.0), quantize(w.cuda(), input_amax=3.0)
    assert torch.equal(qc.packed.cpu(), q.packed)
    assert torch.equal(qc.scale.view(torch.uint8).cpu(), q.scale.view(torch.uint8))
    assert qc.global_scale.item() == q.global_scale.item()
    assert torch.equal(qc.dequantize(torch.bfloat16).cpu(), q.dequantize(torch.bfloat16))
    x = torch.randn(8, 512)
    assert torch.equal(fake_quantize_activation(x.cuda(), q.input_global_scale.cuda()).cpu(),
                       fake_quantize_activation(x, q.input_global_scale))
