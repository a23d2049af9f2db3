"""The engine-start self-check against the plugin's own plain functions (what the plugin's model build will call)."""
import pytest

pytest.importorskip("vllm")

from solar_open2.config import SolarOpen2Config
from solar_open2.selfcheck import engine_selfcheck, require_engine_ok


def test_plugin_plain_functions_pass_the_self_check():
    from solar_open2.vllm.kda import kda_beta, kda_gate_torch
    cfg = SolarOpen2Config.real()
    res = require_engine_ok(cfg, kda_beta_fn=lambda b: kda_beta(b, cfg.kda_allow_neg_eigval),
                            kda_gate_fn=lambda f, A, dt: kda_gate_torch(f, A, cfg.kda_head_dim, dt))
    assert [c.name for c in res] == ["kda_beta", "kda_gate"] and all(c.ok for c in res)
    # the same functions with Kimi-Linear's flag: the check catches it
    assert not engine_selfcheck(cfg, kda_beta_fn=lambda b: kda_beta(b, False))[0].ok
