"""KDA acceptance (issue 4): the chunked form against the loop over the full grid (d up to 128, T up to 300), the
layer's prefill/decode equivalence, beta doubling and the single gate application, and the CPU benchmark script."""
import json, math, subprocess, sys
from pathlib import Path

import pytest
import torch

from solar_open2.config import SolarOpen2Config
from solar_open2.kda import (KDALayer, KDAState, kda_beta, kda_chunked, kda_gate, kda_recurrent, l2norm,
                             random_kda_inputs, rel_rms, short_conv)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("D", [16, 64, 128])
@pytest.mark.parametrize("T", [1, 15, 63, 64, 65, 300])
@pytest.mark.parametrize("init", [False, True])
def test_chunked_matches_recurrent(D, T, init):
    # 2 sequences x 4 heads: see the chapter for why a single head at T = 1 is ill-conditioned in fp32
    x = random_kda_inputs(B=2, T=T, H=4, K=D, seed=1000 + 7 * T + D, initial_state=init)
    o_r, s_r = kda_recurrent(**x, output_final_state=True)
    o_c, s_c = kda_chunked(**x, output_final_state=True)
    assert o_c.dtype == s_c.dtype == torch.float32
    assert rel_rms(o_c, o_r) <= 1e-6
    assert rel_rms(s_c, s_r) <= 1e-6


def test_chunked_is_exact_algebra_in_fp64():
    x = random_kda_inputs(B=1, T=200, H=2, K=32, V=16, seed=7, initial_state=True, decay_scale=3.0)
    x = {n: t.double() for n, t in x.items()}
    o_r, s_r = kda_recurrent(**x, output_final_state=True)
    o_c, s_c = kda_chunked(**x, output_final_state=True)
    assert rel_rms(o_c, o_r) < 1e-12 and rel_rms(s_c, s_r) < 1e-12


def _two_step(beta):
    e0 = torch.tensor([1., 0.])
    q = k = e0.expand(1, 2, 1, 2)
    v = torch.tensor([[2., 0.], [0., 4.]]).view(1, 2, 1, 2)
    g = torch.tensor([[0., 0.], [math.log(0.5), 0.]]).view(1, 2, 1, 2)
    return kda_recurrent(q, k, v, g, beta.expand(1, 2, 1), scale=1.0, output_final_state=True)


def test_beta_doubling_hand_example():
    "b = 0: doubled beta = 1 gives o2 = (0, 4) by hand; plain sigmoid (beta = 1/2) would give (1/4, 2)."
    o, S = _two_step(kda_beta(torch.zeros(())))
    torch.testing.assert_close(o[0, 1, 0], torch.tensor([0., 4.]))
    torch.testing.assert_close(S[0, 0], torch.tensor([[0., 4.], [0., 0.]]))
    o_plain, _ = _two_step(kda_beta(torch.zeros(()), allow_neg_eigval=False))
    torch.testing.assert_close(o_plain[0, 1, 0], torch.tensor([0.25, 2.]))


def test_layer_uses_doubled_beta_and_gates_once():
    cfg = SolarOpen2Config.tiny()
    torch.manual_seed(0)
    lay = KDALayer(cfg, 1)
    H, D = lay.num_heads, lay.head_dim
    with torch.no_grad():
        lay.A_log.zero_(); lay.dt_bias.zero_()
        lay.k_conv1d.weight[..., :-1] = 0; lay.v_conv1d.weight[..., :-1] = 0
        x1 = torch.randn(1, 1, cfg.hidden_size)
        _, st1 = lay(x1)
        k1 = l2norm(short_conv(lay.k_proj(x1), lay.k_conv1d.weight)[0].view(H, D))
        v1 = short_conv(lay.v_proj(x1), lay.v_conv1d.weight)[0].view(H, D)
        beta1 = 2 * torch.sigmoid(lay.b_proj(x1).view(H))
        torch.testing.assert_close(st1.recurrent[0], beta1[:, None, None] * k1[:, :, None] * v1[:, None, :])
        # a zero token writes nothing and decays by exp(-softplus(0)) = 1/2 (twice-gated: 2/3)
        for core in ("recurrent", "chunked"):
            lay.core = core
            _, st2 = lay(torch.zeros(1, 1, cfg.hidden_size), st1)
            torch.testing.assert_close(st2.recurrent, st1.recurrent / 2, rtol=1e-6, atol=1e-9)


def test_layer_prefill_pieces_and_decode_agree():
    cfg = SolarOpen2Config.tiny()
    torch.manual_seed(3)
    lay = KDALayer(cfg, 2)
    x = torch.randn(2, 140, cfg.hidden_size)
    with torch.no_grad():
        y, st = lay(x)
        for cuts in ([5, 6, 70, 139, 140], [64, 128, 140], [97] + list(range(98, 141))):
            state, ys, a = None, [], 0
            for b in cuts:
                yp, state = lay(x[:, a:b], state); ys.append(yp); a = b
            assert rel_rms(torch.cat(ys, 1), y) <= 1e-5
            assert rel_rms(state.recurrent, st.recurrent) <= 1e-5
            assert rel_rms(state.conv, st.conv) <= 1e-5
    assert isinstance(st, KDAState) and st.recurrent.dtype == torch.float32
    assert st.conv.shape == (2, 3 * cfg.kda_dim, cfg.kda_conv_size - 1)


def test_gate_values():
    A_log = torch.zeros(1, 1, 2, 1)
    g = kda_gate(torch.zeros(3, 2 * 4), A_log, torch.zeros(8))
    torch.testing.assert_close(g, torch.full((3, 2, 4), -math.log(2)))


def test_varlen_matches_separate_sequences():
    lens = [3, 64, 0, 9]
    xs = [random_kda_inputs(B=1, T=t, H=2, K=16, seed=i, initial_state=True) for i, t in enumerate(lens)]
    packed = {n: torch.cat([x[n] for x in xs], 0 if n == "initial_state" else 1) for n in xs[0]}
    cu = torch.tensor([0, 3, 67, 67, 76])
    o, s = kda_chunked(**packed, output_final_state=True, cu_seqlens=cu)
    for i, x in enumerate(xs):
        o_i, s_i = kda_recurrent(**x, output_final_state=True)
        torch.testing.assert_close(o[:, cu[i]:cu[i + 1]], o_i, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(s[i:i + 1], s_i, rtol=1e-5, atol=1e-6)


def test_benchmark_script_writes_json(tmp_path):
    out = tmp_path / "kda_cpu.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.kernels.kda_cpu", "--T", "130", "--H", "2", "--D", "16", "--repeats", "1",
                        "--recurrent-repeats", "1", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())
    assert rec["T"] == 130 and rec["speedup"] > 0 and rec["rel_rms_o"] < 1e-5
    r = subprocess.run([sys.executable, "-m", "benchmarks.kernels.kda_cpu", "--T", "0"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "positive" in r.stderr


@pytest.mark.parametrize("init", [False, True])
def test_chunked_matches_recurrent_across_groups(init):
    "More chunks than one group of the chunked form (3 groups, the last partial, a padded last chunk), d = 128."
    T = 17 * 64 - 23
    x = random_kda_inputs(B=2, T=T, H=2, K=128, seed=5000 + init, initial_state=init)
    s0 = x["initial_state"].clone() if init else None
    o_r, s_r = kda_recurrent(**x, output_final_state=True)
    o_c, s_c = kda_chunked(**x, output_final_state=True)
    assert rel_rms(o_c, o_r) <= 1e-6 and rel_rms(s_c, s_r) <= 1e-6
    if init: assert torch.equal(x["initial_state"], s0)
