"""The plugin's options (chapter `vllm/options`) through vLLM's real engine arguments on a CPU: a misspelt or unknown
option fails the engine's start with a message naming it and the valid names; the older per-option keys still work;
two models built in one process with different options keep their own kernels and leave every table as it was; a
tile table measured on sm_90 is not applied on another GPU architecture (a faked device capability)."""
import logging
from unittest import mock

import pytest

from solar_open2.vllm.testing import force_cpu_platform

pytest.importorskip("vllm")
force_cpu_platform()

from solar_open2.checkpoint import tiny_checkpoint                                   # noqa: E402
from solar_open2.vllm.options import NAMES, OPTIONS, Options, parse_options         # noqa: E402
from solar_open2.vllm.testing import build_model, cpu_vllm_config                   # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return tiny_checkpoint("compressed-tensors")


def _engine_config(model_dir, additional_config):
    "What `vllm serve` / `LLM(...)` build first: the engine config from the engine arguments (the plugin registered)."
    from vllm.engine.arg_utils import EngineArgs
    from solar_open2.vllm import register
    register()
    return EngineArgs(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16", enable_prefix_caching=False,
                      **({} if additional_config is None else {"additional_config": additional_config})).create_engine_config()


@pytest.mark.parametrize("ac, name", [({"solar_open2": {"gemv_kernal": False}}, "gemv_kernal"),
                                      ({"solar_open2_moe_pair": True}, "moe_pair"),
                                      ({"solar_open2": {"no_such_option": True}}, "no_such_option")])
def test_an_unknown_option_fails_the_engine_start(tiny, ac, name):
    with pytest.raises(Exception, match=rf"unknown Solar-Open2 option '{name}'.*valid options: {', '.join(NAMES)}"):
        _engine_config(tiny, ac)


def test_a_malformed_value_fails_the_engine_start(tiny):
    with pytest.raises(Exception, match=r"solar_open2.router_kernel: expected true or false, got 'false'"):
        _engine_config(tiny, {"solar_open2": {"router_kernel": "false"}})


def test_valid_options_pass_in_both_forms(tiny):
    for ac in ({"solar_open2": {"gemv_kernel": False}}, {"solar_open2_gemv_kernel": False}, None):
        vc = _engine_config(tiny, ac)
        assert parse_options(vc.additional_config) == (Options() if ac is None else Options().without(["gemv_kernel"]))


def test_the_table_is_what_a_benchmark_needs():
    flags = [(o.flag, o.key, o.default) for o in OPTIONS]
    assert ("gemv-kernel", "solar_open2_gemv_kernel", True) in flags and len(flags) == len(NAMES)
    assert parse_options(Options(moe_pairs=False).as_config()) == Options(moe_pairs=False)


def _gemv_rows(model, name):
    return dict(model.named_modules())[name].quant_method.rows


def test_two_models_with_different_options_in_one_process(tiny):
    from solar_open2.config import SolarOpen2Config
    from solar_open2.vllm.model import SolarOpen2ForCausalLM
    from solar_open2.vllm.ops.gemv import GEMV_TILES, GemvTables
    from solar_open2.vllm.ops.tiles import TileTable
    cfg = SolarOpen2Config.tiny()
    o = (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, "bfloat16")
    flat = TileTable("tiny", {o: ((1, "fma1", (2, 64, 8, 1)),)}, archs=None)
    flat_off = TileTable("tiny, 3-D", {o: ((1, "fma", (4, 64, 4, 2)),)}, archs=None)
    Tiny = type("Tiny", (SolarOpen2ForCausalLM,), {"gemv_tables": lambda self: GemvTables(single=flat, flat_off=flat_off)})
    measured = {k: v for k, v in GEMV_TILES.items()}
    a = build_model(cpu_vllm_config(tiny, additional_config={"solar_open2": {"gemv_flat": False, "kda_gate_kernel": False, "router_kernel": False}}), Tiny)
    b = build_model(cpu_vllm_config(tiny), Tiny)
    name = "model.layers.0.self_attn.o_proj"
    assert _gemv_rows(a, name) == flat_off.rows_for(o) and _gemv_rows(b, name) == flat.rows_for(o)
    assert flat.rows_for(o) == ((1, "fma1", (2, 64, 8, 1)),) and dict(GEMV_TILES.items()) == measured
    kda = lambda m: {l.self_attn.gate_kernel for l in m.model.layers if l.is_kda}
    router = lambda m: {type(l.mlp.experts.router).__name__ for l in m.model.layers}
    assert (kda(a), kda(b), router(a), router(b)) == ({False}, {True}, {"GroupedTopKRouter"}, {"SolarMoERouter"})


class _Lines(logging.Handler):
    def __init__(self): super().__init__(); self.lines = []
    def emit(self, r): self.lines.append(r.getMessage())


@pytest.mark.parametrize("arch, on", [((12, 1), False), ((9, 0), True)])
def test_a_table_measured_on_sm90_is_not_applied_elsewhere(tiny, arch, on):
    from solar_open2.config import SolarOpen2Config
    from solar_open2.vllm.model import SolarOpen2ForCausalLM
    from solar_open2.vllm.ops.gemv import GemvTables
    from solar_open2.vllm.ops.tiles import H200, TileTable
    cfg = SolarOpen2Config.tiny()
    router_key = (cfg.n_routed_experts, cfg.hidden_size, "float32")
    h200 = TileTable("tiny, measured on an H200", {router_key: ((8, "fma", (4, 64, 4)),)}, archs=(H200,))
    Tiny = type("TinyH200", (SolarOpen2ForCausalLM,), {"gemv_tables": lambda self: GemvTables(single=h200)})
    h = _Lines(); lg = logging.getLogger("solar_open2.vllm.model"); lg.addHandler(h)
    try:
        with mock.patch("torch.cuda.is_available", return_value=True), mock.patch("torch.cuda.get_device_capability", return_value=arch):
            m = build_model(cpu_vllm_config(tiny), Tiny)
    finally: lg.removeHandler(h)
    kernels = ("gemv_kernel", "gemv_pairs", "gemv_flat", "kda_gate_kernel", "kda_decode_kernel", "kda_decode_gates", "router_kernel", "moe_kernels", "moe_pairs", "moe_direct_out")
    assert {n: getattr(m.opts, n) for n in kernels} == {n: on for n in kernels}
    assert m.opts.moe_marlin_kernels is False                                 # off by default on every GPU (measured slower than Marlin)
    assert (len(m.applied["gemv"]) == cfg.num_hidden_layers, m.applied["kda_gate_kernel"] > 0, m.applied["moe_kernels"] > 0) == (on, on, on)
    assert {type(l.mlp.experts.router).__name__ for l in m.model.layers} == {"SolarMoERouter" if on else "GroupedTopKRouter"}
    said = [l for l in h.lines if "were not measured on this GPU" in l]
    assert len(said) == (0 if on else 1), h.lines                             # one line says which options fell back, and why


def test_the_parity_runs_select_the_probe_model_through_vllms_registry(tiny):
    "`hf_overrides={'architectures': [PROBE_ARCH]}` (scripts/gpu_parity.py --gemv-probe) builds the test model, every dense layer on the GEMV kernels."
    from vllm.engine.arg_utils import EngineArgs
    from solar_open2.vllm import PROBE_ARCH, register
    register()
    vc = EngineArgs(model=str(tiny), skip_tokenizer_init=True, dtype="bfloat16", enable_prefix_caching=False,
                    hf_overrides={"architectures": [PROBE_ARCH]}).create_engine_config()
    assert vc.model_config.architecture == PROBE_ARCH and vc.model_config.is_hybrid
    m = build_model(vc)
    assert type(m).__name__ == PROBE_ARCH and m.gemv_tables().single.archs is None
    assert len(m.applied["gemv"]) > 0 and "lm_head" in m.applied["gemv"]
