"""The vLLM plugin against the real vllm==0.25.1 package, on a CPU (chapter 08, issue 8).

Registration and packaging, the model built on the tiny config, `load_weights` on the built-in tiny NVFP4
(compressed-tensors and ModelOpt) and BF16 checkpoints (every parameter and every checkpoint tensor, both directions, values bit for bit), the
ignore-list resolution, the 1072-token hybrid block of the real config, and the KDA traps (beta doubling, the gate
applied once, separate q/k/v). vLLM's CPU platform is forced before any vLLM module is imported (see
`solar_open2.vllm.testing`). GPU numerics: `scripts/gpu_parity.py` and `tests/test_plugin_gpu.py`.
"""
import ast, os, re, subprocess, sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from unittest import mock
import torch

from solar_open2.vllm.testing import force_cpu_platform

pytest.importorskip("vllm")
force_cpu_platform()

from solar_open2.config import SolarOpen2Config, FULL, LINEAR                      # noqa: E402
from solar_open2 import vllm as plugin                                             # noqa: E402
from solar_open2.checkpoint import tiny_checkpoint                                  # noqa: E402
from solar_open2.vllm.testing import (RecordingKernels, build_model, checkpoint_slices, checkpoint_tensors,  # noqa: E402
                                      cpu_vllm_config, gdn_metadata, kda_layer, plain_kda, run_layer, same_values)

ROOT = Path(__file__).resolve().parents[1]
TINY = SolarOpen2Config.tiny()
FORMATS = ("compressed-tensors", "modelopt", "bf16")


@pytest.fixture(scope="module")
def tiny_dirs():
    "The built-in tiny checkpoint (chapter 06) in each format: Nota's compressed-tensors NVFP4, ModelOpt NVFP4, BF16."
    return {fmt: tiny_checkpoint(fmt) for fmt in FORMATS}


# --- registration and packaging ---------------------------------------------------------------------------------

def _entry_points_in_setup() -> dict:
    "The `entry_points` dict literal of setup.py's `setup(...)` call (keys and list values)."
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            return {ast.literal_eval(k): [ast.literal_eval(e) if not isinstance(e, ast.JoinedStr) else None for e in v.elts]
                    for k, v in zip(node.value.keys, node.value.values)}
    raise AssertionError("setup.py has no entry_points")


def test_setup_declares_the_entry_point():
    eps = _entry_points_in_setup()
    assert eps.get("vllm.general_plugins") == [plugin.ENTRY_POINT]
    name, target = (s.strip() for s in plugin.ENTRY_POINT.split("="))
    module, func = target.split(":")
    assert name == "solar_open2" and getattr(__import__(module, fromlist=[func]), func) is plugin.register


def test_register_is_idempotent_and_complete():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from vllm import ModelRegistry
    from vllm.config.compilation import CompilationConfig
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from solar_open2.vllm.config import SolarOpen2ConfigHook, SolarOpen2HFConfig
    plugin.register(); plugin.register()
    assert CONFIG_MAPPING["solar_open2"] is SolarOpen2HFConfig
    m = ModelRegistry.models[plugin.ARCH]
    assert f"{m.module_name}:{m.class_name}" == plugin.MODEL_CLASS
    assert CompilationConfig._attention_ops.count(plugin.KDA_OP) == 1
    assert MODELS_CONFIG_MAP[plugin.ARCH] is SolarOpen2ConfigHook
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    assert ReasoningParserManager.lazy_parsers["solar_open2"] == ("solar_open2.vllm.parsers", "SolarOpen2ReasoningParser")
    assert ToolParserManager.lazy_parsers["solar_open2"] == ("solar_open2.vllm.parsers", "SolarOpen2ToolParser")


def test_import_solar_open2_never_imports_vllm():
    code = ("import sys, solar_open2, solar_open2.config, solar_open2.vllm, solar_open2.vllm.config\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'triton', 'flashinfer')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_config_through_autoconfig(tiny_dirs):
    from transformers import AutoConfig
    plugin.register()
    c = AutoConfig.from_pretrained(tiny_dirs["bf16"])
    assert type(c).__name__ == "SolarOpen2HFConfig"
    assert c.layer_types == [FULL, LINEAR, LINEAR, LINEAR] * 2
    assert c.to_solar() == TINY


# --- the model on the tiny config -------------------------------------------------------------------------------

def test_model_builds_on_tiny_config(tiny_dirs):
    vc = cpu_vllm_config(tiny_dirs["bf16"])
    assert vc.model_config.architecture == plugin.ARCH and vc.model_config.is_hybrid
    model = build_model(vc)
    names = {n for n, _ in model.named_parameters()}
    assert {int(n.split(".")[2]) for n in names if ".qkv_proj." in n} == {0, 4}
    assert all(f"model.layers.{L}.self_attn.{x}.weight" in names for L in TINY.kda_layers for x in ("qkvb_proj", "qkv_conv1d"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_load_weights_every_parameter_and_every_tensor(tiny_dirs, fmt):
    from solar_open2.vllm.model import _OPTIONAL_PARAMS
    vc = cpu_vllm_config(tiny_dirs[fmt])
    model = build_model(vc)
    ckpt = checkpoint_tensors(tiny_dirs[fmt])
    seen = []
    loaded = model.load_weights((seen.append(n) or (n, t)) for n, t in ckpt.items())
    params = dict(model.named_parameters())
    assert seen == list(ckpt)                                                   # every tensor consumed (unknown ones raise)
    assert loaded == {n for n in params if not _OPTIONAL_PARAMS.search(n)}      # every parameter filled
    assert {n for n in params if _OPTIONAL_PARAMS.search(n)} == (set() if fmt == "bf16" else
           {n for n in params if ".attn." in n})                                # only KV-cache quantization params exempt
    slices = checkpoint_slices(TINY, ckpt, params)
    assert sorted(n for n, t in ckpt.items() if not same_values(slices[n], t)) == []
    if fmt != "bf16":
        assert params["model.layers.1.mlp.experts.routed_experts.w13_weight" + ("_packed" if fmt == "compressed-tensors" else "")].dtype == torch.uint8


def test_load_weights_refuses_unknown_missing_and_fused_kda(tiny_dirs):
    from solar_open2.vllm.model import WeightLoadError
    vc = cpu_vllm_config(tiny_dirs["bf16"])
    ckpt = checkpoint_tensors(tiny_dirs["bf16"])
    with pytest.raises(WeightLoadError, match=r"1 checkpoint tensor\(s\) the model does not know.*model.layers.8"):
        build_model(vc).load_weights(iter({**ckpt, "model.layers.8.mlp.gate.weight": torch.zeros(8, 256)}.items()))
    with pytest.raises(WeightLoadError, match=r"model.layers.4.self_attn.g_proj.weight"):
        build_model(vc).load_weights((n, t) for n, t in ckpt.items() if n != "model.layers.4.self_attn.g_proj.weight")
    fused = {n: t for n, t in ckpt.items() if not (n.startswith("model.layers.1.self_attn.") and n.split(".")[-2] in ("q_proj", "k_proj", "v_proj"))}
    fused["model.layers.1.self_attn.qkv_proj.weight"] = torch.cat([ckpt[f"model.layers.1.self_attn.{x}_proj.weight"] for x in "qkv"])
    with pytest.raises(WeightLoadError, match=r"model.layers.1.self_attn.qkv_proj.weight"):
        build_model(vc).load_weights(iter(fused.items()))


@pytest.mark.parametrize("gone", ["model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"])
def test_load_weights_refuses_a_fused_parameter_missing_one_part(tiny_dirs, gone):
    "GQA qkv_proj and shared gate_up_proj count as filled only when every part arrived (as the fused KDA ones do)."
    from solar_open2.vllm.model import WeightLoadError
    ckpt = checkpoint_tensors(tiny_dirs["bf16"])
    fused = gone.replace("k_proj", "qkv_proj").replace("up_proj", "gate_up_proj")
    with pytest.raises(WeightLoadError, match=r"1 parameter\(s\) the checkpoint did not fill.*" + re.escape(fused)):
        build_model(cpu_vllm_config(tiny_dirs["bf16"])).load_weights((n, t) for n, t in ckpt.items() if n != gone)


@pytest.mark.parametrize("fmt", ("compressed-tensors", "modelopt"))
def test_ignore_list_keeps_fused_bf16_and_experts_nvfp4(tiny_dirs, fmt):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    model = build_model(cpu_vllm_config(tiny_dirs[fmt]))
    mods = dict(model.named_modules())
    for n in ("model.layers.0.self_attn.qkv_proj", "model.layers.4.self_attn.g_proj", "model.layers.1.self_attn.qkvb_proj",
              "model.layers.1.self_attn.fg_a_proj",
              "model.layers.1.self_attn.g_b_proj", "model.layers.1.mlp.shared_experts.gate_up_proj",
              "model.layers.1.mlp.shared_experts.down_proj", "model.layers.1.mlp.gate"):
        assert type(mods[n].quant_method) is UnquantizedLinearMethod, n
    assert "nvfp4" in type(mods["model.layers.1.mlp.experts.routed_experts"].quant_method).__name__.lower()


def test_without_packed_mapping_the_fused_qkv_would_be_nvfp4(tiny_dirs):
    import json
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from solar_open2.vllm.model import SolarOpen2ForCausalLM
    q = json.loads((tiny_dirs["compressed-tensors"] / "config.json").read_text())["quantization_config"]
    ct = CompressedTensorsConfig.from_config(q)
    layer = torch.nn.Linear(1, 1)   # only the class name is consulted ('Linear' target) besides the prefix
    ct.packed_modules_mapping = SolarOpen2ForCausalLM.packed_modules_mapping
    assert ct.get_scheme_dict(layer, "model.layers.0.self_attn.qkv_proj") is None
    assert ct.get_scheme_dict(layer, "model.layers.1.mlp.shared_experts.gate_up_proj") is None
    ct.packed_modules_mapping = {}
    assert ct.get_scheme_dict(layer, "model.layers.0.self_attn.qkv_proj") is not None


# --- the fused KDA projections (`solar_open2_fuse_kda_proj`, the default; false = separate) --------------------

FUSED, SEPARATE = {"solar_open2_fuse_kda_proj": True}, {"solar_open2_fuse_kda_proj": False}


@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_kda_proj_builds_and_loads_every_tensor(tiny_dirs, fmt):
    from solar_open2.vllm.model import _OPTIONAL_PARAMS
    model = build_model(cpu_vllm_config(tiny_dirs[fmt], additional_config=FUSED))
    params = dict(model.named_parameters())
    for L in TINY.kda_layers:
        mine = {n.split(".")[4] for n in params if n.startswith(f"model.layers.{L}.self_attn.")}
        assert {"qkvb_proj", "fg_a_proj", "f_b_proj", "g_b_proj", "o_proj"} <= mine, mine
        assert not mine & {"q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj", "qkv_proj"}, mine
    assert {int(n.split(".")[2]) for n in params if ".qkv_proj." in n} == {0, 4}           # GQA keeps its qkv_proj
    P, H, D = TINY.kda_num_heads * TINY.kda_head_dim, TINY.kda_num_heads, TINY.kda_head_dim
    assert params["model.layers.1.self_attn.qkvb_proj.weight"].shape[0] == 3 * P + H
    assert params["model.layers.1.self_attn.fg_a_proj.weight"].shape[0] == 2 * D
    ckpt = checkpoint_tensors(tiny_dirs[fmt])
    seen = []
    loaded = model.load_weights((seen.append(n) or (n, t)) for n, t in ckpt.items())
    assert seen == list(ckpt)
    assert loaded == {n for n in params if not _OPTIONAL_PARAMS.search(n)}
    slices = checkpoint_slices(TINY, ckpt, params)
    assert sorted(n for n, t in ckpt.items() if not same_values(slices[n], t)) == []
    b = slices["model.layers.1.self_attn.b_proj.weight"]                         # the last block, not f_b/g_b
    assert b.shape == ckpt["model.layers.1.self_attn.b_proj.weight"].shape


@pytest.mark.parametrize("fmt", ("compressed-tensors", "modelopt"))
def test_kda_proj_stays_bf16_under_the_ignore_list_in_both_layouts(tiny_dirs, fmt):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    mods = dict(build_model(cpu_vllm_config(tiny_dirs[fmt], additional_config=FUSED)).named_modules())
    sep = dict(build_model(cpu_vllm_config(tiny_dirs[fmt], additional_config=SEPARATE)).named_modules())
    for L in TINY.kda_layers:
        for m in ("q_proj", "b_proj", "f_a_proj", "g_a_proj"):
            assert type(sep[f"model.layers.{L}.self_attn.{m}"].quant_method) is UnquantizedLinearMethod, (L, m)
        for m in ("qkvb_proj", "fg_a_proj", "f_b_proj", "o_proj"):
            assert type(mods[f"model.layers.{L}.self_attn.{m}"].quant_method) is UnquantizedLinearMethod, (L, m)
    assert "nvfp4" in type(mods["model.layers.1.mlp.experts.routed_experts"].quant_method).__name__.lower()


def test_fused_kda_proj_still_refuses_fused_qkv_unknown_and_missing(tiny_dirs):
    from solar_open2.vllm.model import WeightLoadError
    vc = cpu_vllm_config(tiny_dirs["bf16"], additional_config=FUSED)
    ckpt = checkpoint_tensors(tiny_dirs["bf16"])
    fused = {n: t for n, t in ckpt.items() if not (n.startswith("model.layers.1.self_attn.") and n.split(".")[-2] in ("q_proj", "k_proj", "v_proj"))}
    fused["model.layers.1.self_attn.qkv_proj.weight"] = torch.cat([ckpt[f"model.layers.1.self_attn.{x}_proj.weight"] for x in "qkv"])
    with pytest.raises(WeightLoadError, match=r"model.layers.1.self_attn.qkv_proj.weight"):
        build_model(vc).load_weights(iter(fused.items()))
    with pytest.raises(WeightLoadError, match=r"1 checkpoint tensor\(s\) the model does not know.*model.layers.8"):
        build_model(vc).load_weights(iter({**ckpt, "model.layers.8.self_attn.b_proj.weight": torch.zeros(4, 256)}.items()))
    with pytest.raises(WeightLoadError, match=r"model.layers.2.self_attn.qkvb_proj.weight"):   # a missing b_proj leaves its block unfilled
        build_model(vc).load_weights((n, t) for n, t in ckpt.items() if n != "model.layers.2.self_attn.b_proj.weight")
    with pytest.raises(WeightLoadError, match=r"model.layers.2.self_attn.fg_a_proj.weight"):
        build_model(vc).load_weights((n, t) for n, t in ckpt.items() if n != "model.layers.2.self_attn.g_a_proj.weight")


@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_is_the_default_and_false_gives_the_separate_projections(tiny_dirs, fmt):
    from solar_open2.vllm.model import _OPTIONAL_PARAMS
    names = {n for n, _ in build_model(cpu_vllm_config(tiny_dirs[fmt])).named_parameters()}
    assert all(f"model.layers.{L}.self_attn.{x}.weight" in names for L in TINY.kda_layers for x in ("qkvb_proj", "fg_a_proj"))
    model = build_model(cpu_vllm_config(tiny_dirs[fmt], additional_config=SEPARATE))
    params = dict(model.named_parameters())
    assert not any(".qkvb_proj." in n or ".fg_a_proj." in n for n in params)
    assert all(f"model.layers.{L}.self_attn.{x}_proj.weight" in params for L in TINY.kda_layers for x in ("q", "k", "v", "b", "f_a", "g_a"))
    ckpt = checkpoint_tensors(tiny_dirs[fmt])
    assert model.load_weights(iter(ckpt.items())) == {n for n in params if not _OPTIONAL_PARAMS.search(n)}
    slices = checkpoint_slices(TINY, ckpt, params)
    assert sorted(n for n, t in ckpt.items() if not same_values(slices[n], t)) == []


@pytest.mark.parametrize("fused", (True, False))
def test_the_stacked_conv_weight_needs_all_three_parts(tiny_dirs, fused):
    from solar_open2.vllm.model import WeightLoadError
    vc = cpu_vllm_config(tiny_dirs["bf16"], additional_config={"solar_open2_fuse_kda_proj": fused})
    ckpt = checkpoint_tensors(tiny_dirs["bf16"])
    with pytest.raises(WeightLoadError, match=r"model.layers.2.self_attn.qkv_conv1d.weight"):
        build_model(vc).load_weights((n, t) for n, t in ckpt.items() if n != "model.layers.2.self_attn.k_conv1d.weight")
    two_d = {n: (t[:, 0] if n.endswith("_conv1d.weight") else t) for n, t in ckpt.items()}   # conv stored [P, K]
    m = build_model(vc); m.load_weights(iter(two_d.items()))
    w = dict(m.named_parameters())["model.layers.1.self_attn.qkv_conv1d.weight"]
    P = TINY.kda_num_heads * TINY.kda_head_dim
    assert torch.equal(w[P:2 * P], ckpt["model.layers.1.self_attn.k_conv1d.weight"].to(w.dtype))


@pytest.mark.parametrize("tp,page", [(1, 4_390_912), (2, 2_195_456), (8, 548_864)])
def test_real_config_state_gives_the_1072_token_block(tmp_path, tp, page):
    from vllm.config import ParallelConfig
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
    from solar_open2.vllm.model import SolarOpen2ForCausalLM as M
    SolarOpen2Config.real().save(tmp_path)                                      # the config is all this needs
    vc = cpu_vllm_config(tmp_path, parallel_config=ParallelConfig(tensor_parallel_size=tp))
    shapes, dtypes = M.get_mamba_state_shape_from_config(vc), M.get_mamba_state_dtype_from_config(vc)
    assert shapes == ((3, 3 * 8192 // tp), (64 // tp, 128, 128)) and dtypes == (torch.bfloat16, torch.float32)
    mamba = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes
    attn1 = FullAttentionSpec(block_size=1, num_kv_heads=vc.model_config.get_num_kv_heads(vc.parallel_config),
                              head_size=128, dtype=torch.bfloat16).page_size_bytes
    assert 16 * -(-mamba // (16 * attn1)) == 1072
    vc.cache_config.block_size = 16
    Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
    assert (vc.cache_config.block_size, vc.cache_config.mamba_page_size_padded) == (1072, page)


# --- the KDA traps ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kda_bench():
    from vllm.config import SchedulerConfig
    d = tiny_checkpoint("bf16")
    vc = cpu_vllm_config(d, scheduler_config=SchedulerConfig(max_model_len=TINY.max_position_embeddings, is_encoder_decoder=False,
                                                             max_num_batched_tokens=130, max_num_seqs=3, enable_chunked_prefill=True),
                         additional_config=SEPARATE)   # the separate layout; the fused one is compared to it
    ck = checkpoint_tensors(d)
    W = {k.removeprefix("model.layers.1.self_attn."): v for k, v in ck.items() if k.startswith("model.layers.1.self_attn.")}
    return SimpleNamespace(vc=vc, W=W, n=iter(range(10, 100)))


def _layer(b, kernels=None):
    return kda_layer(b.vc, b.W, f"model.layers.{next(b.n)}.self_attn", kernels=kernels)


def test_kda_layer_matches_the_math_prefill_decode_mixed(kda_bench):
    torch.manual_seed(1)
    layer = _layer(kda_bench)
    xa, xb = torch.randn(7, 256).to(torch.bfloat16), torch.randn(5, 256).to(torch.bfloat16)
    steps = [(torch.cat([xa[:5], xb[:2]]), gdn_metadata([5, 2], [1, 2], [False, False])),   # two prefills
             (torch.cat([xa[5:6], xb[2:3]]), gdn_metadata([1, 1], [1, 2], [True, True])),   # two decodes
             (torch.cat([xa[6:7], xb[3:5]]), gdn_metadata([1, 2], [1, 2], [True, True]))]   # decode + continued prefill
    outs = torch.cat([run_layer(layer, x, md, kda_bench.vc) for x, md in steps])
    ra, rb = plain_kda(kda_bench.W, xa, TINY), plain_kda(kda_bench.W, xb, TINY)
    want = torch.cat([ra[:5], rb[:2], ra[5:6], rb[2:3], ra[6:7], rb[3:5]])
    err, tol = (outs - want).abs().max().item(), 2e-2 * want.abs().max().item()
    assert err < tol, (err, tol)
    # the comparison catches both traps: a forgotten doubling, a gate applied twice
    for kw in ({"beta_fn": torch.sigmoid}, {"gate_twice": True}):
        bad = plain_kda(kda_bench.W, xa, TINY, **kw)
        assert (outs[:5] - bad[:5]).abs().max().item() > max(10 * err, tol), kw


def test_fused_kda_layer_matches_the_separate_one_and_the_math(kda_bench):
    vcf = cpu_vllm_config(tiny_checkpoint("bf16"), scheduler_config=kda_bench.vc.scheduler_config, additional_config=FUSED)
    torch.manual_seed(1)
    sep, fus = _layer(kda_bench), kda_layer(vcf, kda_bench.W, "model.layers.1.self_attn")
    assert fus.fused and not sep.fused and hasattr(fus, "qkvb_proj") and not hasattr(fus, "q_proj")
    xa, xb = torch.randn(7, 256).to(torch.bfloat16), torch.randn(5, 256).to(torch.bfloat16)
    steps = [(torch.cat([xa[:5], xb[:2]]), [5, 2], [1, 2], [False, False]),
             (torch.cat([xa[5:6], xb[2:3]]), [1, 1], [1, 2], [True, True]),
             (torch.cat([xa[6:7], xb[3:5]]), [1, 2], [1, 2], [True, True])]
    got_s = torch.cat([run_layer(sep, x, gdn_metadata(*md), kda_bench.vc) for x, *md in steps])
    got_f = torch.cat([run_layer(fus, x, gdn_metadata(*md), vcf) for x, *md in steps])
    with torch.no_grad():                                                     # the fused GEMMs hold the separate ones
        x = xa
        q, k, v, b = fus.qkvb_proj(x)[0].split([512, 512, 512, 4], -1)
        fa, ga = fus.fg_a_proj(x)[0].split([128, 128], -1)
        for got, mod in ((q, sep.q_proj), (k, sep.k_proj), (v, sep.v_proj), (b, sep.b_proj), (fa, sep.f_a_proj), (ga, sep.g_a_proj)):
            want = mod(x)[0]
            assert (got.float() - want.float()).abs().max().item() <= 2 ** -7 * want.float().abs().max().item()   # bf16 rounding at most
    ra, rb = plain_kda(kda_bench.W, xa, TINY), plain_kda(kda_bench.W, xb, TINY)
    want = torch.cat([ra[:5], rb[:2], ra[5:6], rb[2:3], ra[6:7], rb[3:5]])
    scale = want.abs().max().item()
    d_sep, err = (got_f - got_s).abs().max().item(), (got_f - want).abs().max().item()
    assert d_sep <= 1e-2 * scale, (d_sep, scale)
    assert err < 2e-2 * scale, (err, scale)


def test_kda_kernels_get_doubled_beta_and_the_raw_gate_once(kda_bench):
    rec = RecordingKernels()
    layer = _layer(kda_bench, kernels=rec)
    x = torch.randn(4, 256).to(torch.bfloat16)
    with torch.no_grad():
        raw, b = layer.f_b_proj(layer.f_a_proj(x)[0])[0], layer.b_proj(x)[0]
    run_layer(layer, x, gdn_metadata([4], [1], [False]), kda_bench.vc)            # prefill
    assert rec.slots() == ["conv_prefill", "chunk"]                           # one conv over [q | k | v]
    kw = rec.calls[-1][2]
    assert torch.equal(kw["raw_g"].reshape(raw.shape), raw)
    assert kw["beta"].dtype == torch.float32 and torch.equal(kw["beta"].reshape(b.shape), 2 * torch.sigmoid(b.float()))
    rec.calls.clear()
    x1 = x[:1]
    with torch.no_grad(): raw1, b1 = layer.f_b_proj(layer.f_a_proj(x1)[0])[0], layer.b_proj(x1)[0]
    run_layer(layer, x1, gdn_metadata([1], [1], [True]), kda_bench.vc)            # decode
    assert rec.slots() == ["conv_decode", "gate", "recurrent"]
    gate, recur = rec.calls[-2], rec.calls[-1]
    assert torch.equal(gate[1][0], raw1)                                          # raw gate into the gate kernel
    assert torch.equal(recur[2]["g"].reshape(gate[3].shape), gate[3])             # its output, untouched, into the recurrence
    assert torch.equal(recur[2]["beta"].reshape(b1.shape), 2 * torch.sigmoid(b1.float()))


def test_kda_warmup_runs_at_the_scheduler_size_with_doubled_beta(kda_bench):
    from solar_open2.vllm import kda
    rec = RecordingKernels()
    layer = _layer(kda_bench, kernels=rec)
    assert layer.warmup_tokens == 128 and layer.warmup_seqs == 3
    kda._WARMED.clear()
    run_layer(layer, torch.randn(8, 256).to(torch.bfloat16), None, kda_bench.vc)
    assert rec.slots() == ["chunk", "gate", "recurrent"]
    kw = rec.calls[0][2]
    assert kw["q"].shape[1] == 128 and kw["cu_seqlens"].tolist() == [0, 128]
    assert kw["beta"].dtype == torch.float32 and 1.0 < kw["beta"].max().item() < 2.0
    assert rec.calls[2][2]["q"].shape[1] == 3


def test_kda_reference_chapter_agrees(kda_bench):
    "Once the KDA chapter has landed: its KDALayer on the same weights gives the plugin's outputs."
    ref = pytest.importorskip("solar_open2.kda")
    layer = _layer(kda_bench)
    torch.manual_seed(2)
    x = torch.randn(6, 256).to(torch.bfloat16)
    got = run_layer(layer, x, gdn_metadata([6], [1], [False]), kda_bench.vc)
    m = ref.KDALayer(TINY, layer_idx=1)
    m.load_state_dict(kda_bench.W, strict=True)
    with torch.no_grad(): y, _ = m(x.float()[None])
    assert (got - y[0].float()).abs().max().item() < 2e-2 * y.abs().max().item()   # bf16 projections vs fp32: ~0.5%


@pytest.mark.parametrize("method", ["mtp", "deepseek_mtp", "qwen3_next_mtp"])
def test_speculative_methods_the_model_cannot_run_are_refused(tiny_dirs, method):
    from solar_open2.vllm.config import SolarOpen2ConfigHook
    from solar_open2.vllm.model import SolarOpen2ForCausalLM
    spec = SimpleNamespace(speculative_config=SimpleNamespace(method=method, num_speculative_tokens=3))
    with pytest.raises(NotImplementedError, match=f"speculative method '{method}' is not supported"):
        SolarOpen2ConfigHook.verify_and_update_config(spec)
    with pytest.raises(NotImplementedError, match=f"speculative method '{method}' is not supported"):
        SolarOpen2ForCausalLM(vllm_config=spec)


def test_ngram_speculation_builds_the_model_with_widened_conv_state(tiny_dirs):
    "An ngram speculative config passes the hook and builds the model; its KDA conv state has K-1+k columns, as the budget counts."
    from solar_open2.budget import kda_state_shapes
    from solar_open2.vllm.config import SolarOpen2ConfigHook
    from solar_open2.vllm.model import SolarOpen2ForCausalLM as M
    from solar_open2.vllm.testing import spec_vllm_config
    vc = spec_vllm_config(tiny_dirs["bf16"], 3, dtype="bfloat16")
    SolarOpen2ConfigHook.verify_and_update_config(vc)
    model = build_model(vc)
    layer = model.model.layers[1].self_attn
    shapes = layer.get_state_shape()
    assert sorted(shapes[0]) == sorted((3 * 512, 3 + 3)) and shapes[1] == (4, 128, 128)
    assert tuple(map(tuple, M.get_mamba_state_shape_from_config(vc))) == tuple(map(tuple, shapes))
    assert tuple(map(tuple, shapes)) == tuple(map(tuple, kda_state_shapes(TINY, 1, 3)))


@pytest.mark.parametrize("rank", (0, 1))
def test_stacked_kda_parameters_shard_block_by_block_at_tp2(tiny_dirs, monkeypatch, rank):
    """At tensor parallel 2, rank r's `qkv_conv1d` holds `[q_r; k_r; v_r]` (the conv state's order per rank) and
    `qkvb_proj` `[q_r; k_r; v_r; b_r]`: each checkpoint block sharded on its own, not a slice of the stacked matrix."""
    import vllm.model_executor.layers.linear as lin
    import vllm.model_executor.model_loader.weight_utils as wu
    from solar_open2.vllm import kda as K
    for mod, fn, val in ((lin, "get_tensor_model_parallel_world_size", 2), (lin, "get_tensor_model_parallel_rank", rank),
                         (K, "get_tensor_model_parallel_world_size", 2), (wu, "get_tensor_model_parallel_rank", rank)):
        monkeypatch.setattr(mod, fn, lambda v=val: v)
    ckpt = checkpoint_tensors(tiny_dirs["bf16"])
    W = {k.removeprefix("model.layers.1.self_attn."): v for k, v in ckpt.items() if k.startswith("model.layers.1.self_attn.")}
    layer = kda_layer(cpu_vllm_config(tiny_dirs["bf16"]), W, f"model.layers.{40 + rank}.self_attn")
    P, H = TINY.kda_num_heads * TINY.kda_head_dim, TINY.kda_num_heads
    half = lambda t, n: t[rank * n // 2:(rank + 1) * n // 2]
    conv = torch.cat([half(W[f"{x}_conv1d.weight"], P) for x in "qkv"])
    assert torch.equal(layer.qkv_conv1d.weight.data, conv.to(layer.qkv_conv1d.weight.dtype))
    qkvb = torch.cat([half(W[f"{x}_proj.weight"], P) for x in "qkv"] + [half(W["b_proj.weight"], H)])
    assert torch.equal(layer.qkvb_proj.weight.data, qkvb)
    assert torch.equal(layer.fg_a_proj.weight.data, torch.cat([W["f_a_proj.weight"], W["g_a_proj.weight"]]))   # replicated
    assert layer.get_state_shape()[0] == (3, 3 * P // 2)                        # the conv state: [q_r; k_r; v_r] channels


def test_kda_gate_lower_bound_is_refused_naming_the_field(tiny_dirs, tmp_path):
    "32.5: a config.json with kda_gate_lower_bound: the reference computes the bounded gate, the plugin refuses to build."
    import json, shutil
    d = tmp_path / "lb"; shutil.copytree(tiny_dirs["bf16"], d)
    c = json.loads((d / "config.json").read_text()); c["kda_gate_lower_bound"] = -5.0
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match="kda_gate_lower_bound=-5.0"): build_model(cpu_vllm_config(d))
    from solar_open2.model import SolarOpen2ForCausalLM
    ref = SolarOpen2ForCausalLM.from_pretrained(d)
    assert {m.gate_lower_bound for m in ref.modules() if hasattr(m, "gate_lower_bound")} == {-5.0}


# --- speculative decoding: verify N draft tokens, accept j (issue 27) -----------------------------------------

@pytest.fixture(scope="module")
def spec_bench():
    "The KDA layer (fp32, torch kernels) in an engine with an ngram speculative config of 3 draft tokens, and the reference layer."
    from solar_open2.vllm.testing import kda_spec_bench
    b = kda_spec_bench(3)
    b.n = iter(range(100, 200))
    return b


def _spec_state(layer, conv_slot, rec_slot, offset):
    "A slot's state as the reference's KDAState: conv columns [offset, offset+K-1) of `conv_slot`, recurrent `rec_slot` as [1, H, K, V]."
    from solar_open2.kda import KDAState
    conv, rec = layer.conv_states()                                           # [slots, 3P, K-1+k], [slots, H, V, K]
    return KDAState(conv[conv_slot:conv_slot + 1, :, offset:offset + TINY.kda_conv_size - 1].clone(),
                    rec[rec_slot][None].transpose(-1, -2).clone())


from solar_open2.vllm.testing import ref_steps as _ref_steps                      # noqa: E402


@pytest.mark.parametrize("j", [0, 1, 2, 3])
def test_spec_verify_in_a_mixed_batch_equals_sequential_decode(spec_bench, j):
    """One engine step holding a verify of 1+3 tokens resumed after j accepted drafts (A), a one-token verify (D: no
    drafts this step), a new prefill (B) and a continued prefill (C), metadata from vLLM's own builder: every output and
    every state equals the reference layer decoding A's and D's tokens one by one and prefilling B and C (fp32, <= 1e-5);
    A's per-token states equal the reference's `KDALayer.verify`."""
    from solar_open2.kda import rel_rms
    from solar_open2.vllm.testing import gdn_step
    b, ref = spec_bench, spec_bench.ref
    layer = kda_layer(b.vc, b.W, f"model.layers.{next(b.n)}.self_attn", slots=17)
    run = lambda x, md: run_layer(layer, x, md, b.vc)
    close = lambda a, c: rel_rms(a, c) <= 1e-5
    A, D, B, C = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]
    torch.manual_seed(10 + j)
    xa, xd, xb, xc = torch.randn(5 + 4 + 4, 256), torch.randn(4 + 1, 256), torch.randn(6, 256), torch.randn(3 + 4, 256)
    with torch.no_grad():
        run(torch.cat([xa[:5], xd[:4], xc[:3]]), gdn_step(b.vc, [5, 4, 3], [0, 0, 0], [A, D, C]))           # three prefills, a plain step
        run(xa[5:9], gdn_step(b.vc, [4], [5], [A], drafts=[3], num_accepted=[1]))                      # A verifies 1+3
        x = torch.cat([xa[9:13], xd[4:5], xb, xc[3:]])                                                   # A, D verify; B, C prefill
        md = gdn_step(b.vc, [4, 1, 6, 4], [6 + j, 4, 0, 3], [A, D, B, C], drafts=[3, 0, -1, -1], num_accepted=[j + 1, 1, 1, 1])
        assert (md.num_spec_decodes, md.num_prefills, md.num_decodes) == (2, 2, 0)
        y = run(x, md)
        ya, sa = _ref_steps(ref, xa[:5], None, False)
        ya, sa = _ref_steps(ref, xa[5:6 + j], sa)                                  # the last step's accepted tokens
        yv, ver = ref.verify(xa[None, 9:13], sa)
        ya, sa = _ref_steps(ref, xa[9:13], sa)
        yd, sd = _ref_steps(ref, xd[:4], None, False); yd, sd = _ref_steps(ref, xd[4:5], sd)
        yb, sb = _ref_steps(ref, xb, None, False)
        yc, sc = _ref_steps(ref, xc[:3], None, False); yc, sc = _ref_steps(ref, xc[3:], sc, False)
        want = torch.cat([ya, yd, yb, yc])
        assert close(y, want), rel_rms(y, want)
        assert close(y[:4], yv[0])
        for t in range(4):                                                        # A: every token's state in its slot
            got = _spec_state(layer, A[0], A[t], t)
            assert close(got.recurrent, ver.recurrent[:, t]) and close(got.conv, ver.conv[:, t]), t
        for got, st in ((_spec_state(layer, A[0], A[3], 3), sa), (_spec_state(layer, D[0], D[0], 0), sd),
                        (_spec_state(layer, B[0], B[0], 0), sb), (_spec_state(layer, C[0], C[0], 0), sc)):
            assert close(got.recurrent, st.recurrent) and close(got.conv, st.conv)
        # teeth: had the layer resumed after one accepted draft more or less, its outputs would be far off
        _, s_pre = _ref_steps(ref, xa[:5], None, False)
        for other in {max(j - 1, 0), min(j + 1, 3)} - {j}:
            _, s_other = _ref_steps(ref, xa[5:6 + other], s_pre)
            assert rel_rms(ref.verify(xa[None, 9:13], s_other)[0][0], y[:4]) > 1e-3, other


@pytest.mark.parametrize("j", [0, 1, 3])
@pytest.mark.parametrize("beside", [False, True])
def test_a_step_without_drafts_resumes_after_the_accepted_drafts(spec_bench, j, beside):
    """A decode that got no drafts (ngram found no match: the runner marks it -1) after a verify that accepted j drafts,
    alone (vLLM 0.25.1/0.26.0 then skip the speculative path for the whole step) or beside another request's verify (it
    becomes a one-token prefill): its output and state equal the reference's j+1 sequential steps and then this one
    (fp32, <= 1e-5). Without `fold_accepted` it resumed from the verify's first token: the GPU run's divergence."""
    from solar_open2.kda import rel_rms
    from solar_open2.vllm.testing import gdn_step
    b, ref = spec_bench, spec_bench.ref
    layer = kda_layer(b.vc, b.W, f"model.layers.{next(b.n)}.self_attn", slots=17)
    run = lambda x, md: run_layer(layer, x, md, b.vc)
    close = lambda a, c: rel_rms(a, c) <= 1e-5
    A, E = [1, 2, 3, 4], [5, 6, 7, 8]
    torch.manual_seed(20 + j)
    xa, xe = torch.randn(5 + 4 + 1, 256), torch.randn(5 + 4 + 3, 256)
    with torch.no_grad():
        run(torch.cat([xa[:5], xe[:5]]), gdn_step(b.vc, [5, 5], [0, 0], [A, E]))                             # two prefills
        run(torch.cat([xa[5:9], xe[5:9]]), gdn_step(b.vc, [4, 4], [5, 5], [A, E], drafts=[3, 3], num_accepted=[1, 1]))
        if beside:   # E verifies 1+2 after accepting 1 draft; A has no draft this step
            md = gdn_step(b.vc, [3, 1], [5 + 2, 6 + j], [E, A], drafts=[2, -1], num_accepted=[2, j + 1])
            y = run(torch.cat([xe[9:12], xa[9:10]]), md)[3:]
        else:
            y = run(xa[9:10], gdn_step(b.vc, [1], [6 + j], [A], drafts=[-1], num_accepted=[j + 1]))
        _, sa = _ref_steps(ref, xa[:5], None, False)
        _, sa = _ref_steps(ref, xa[5:6 + j], sa)                                   # the verify's accepted tokens
        want, sa = _ref_steps(ref, xa[9:10], sa)                                    # then this step's token
        assert close(y, want), rel_rms(y, want)
        got = _spec_state(layer, A[0], A[0], 0)
        assert close(got.recurrent, sa.recurrent) and close(got.conv, sa.conv)


@pytest.mark.parametrize("reqs", [1, 3])
def test_a_random_walk_of_verifies_and_plain_steps_follows_the_reference(spec_bench, reqs):
    """Twenty engine steps after the prefills, each request at each step either without drafts (the runner's -1: one
    token) or verifying 1-3 drafts of which a random number is accepted, as an ngram proposer produces them; metadata
    from the layer's builder with the previous step's accepted counts (`testing.spec_walk`): every output of every step
    equals the reference layer run token by token over the same inputs from the state the accepted tokens left (fp32,
    <= 1e-5), draft-less steps right after accepted drafts among them."""
    from solar_open2.vllm.testing import spec_walk
    layer = kda_layer(spec_bench.vc, spec_bench.W, f"model.layers.{next(spec_bench.n)}.self_attn", slots=1 + 4 * reqs)
    r = spec_walk(layer, spec_bench, reqs, steps=20, seed=30 + reqs)
    assert r["plain_after_accepts"] >= 1 and r["worst"] <= 1e-5, r


def test_a_graph_capture_leaves_no_accepted_counts_behind():
    """vLLM captures full CUDA graphs with made-up accepted counts (each request's query length); the builder must not
    keep them: a draft-less step before any real verify then folds nothing."""
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from solar_open2.vllm.testing import _bench_builder, gdn_step, kda_spec_bench
    vc = kda_spec_bench(3).vc                                                     # a config of its own: a fresh builder
    b, _ = _bench_builder(vc, 3)
    qsl = torch.tensor([0, 4, 8], dtype=torch.int32)
    m = CommonAttentionMetadata(query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=torch.tensor([9, 9], dtype=torch.int32),
                                num_reqs=2, num_actual_tokens=8, max_query_len=4, max_seq_len=9,
                                block_table_tensor=torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32),
                                slot_mapping=torch.zeros(8, dtype=torch.int64))
    import vllm.utils.torch_utils as tu, vllm.v1.attention.backends.utils as bu
    with mock.patch.object(tu, "PIN_MEMORY", False), mock.patch.object(bu, "PIN_MEMORY", False):
        assert b.build_for_cudagraph_capture(m).num_spec_decodes == 2
    assert getattr(b, "_accepted", None) is None
    assert gdn_step(vc, [1], [9], [[1, 2, 3, 4]], drafts=[-1]).solar_fold is None   # nothing to go on: no fold
    gdn_step(vc, [4], [5], [[1, 2, 3, 4]], drafts=[3], num_accepted=[1])           # a real verify brings the runner's buffer
    f = gdn_step(vc, [1], [9], [[1, 2, 3, 4]], drafts=[-1], num_accepted=[3]).solar_fold
    assert f[0].tolist() == [[1, 2, 3, 4]] and f[1].tolist() == [3]


class _EmptyLikeKernels:
    "The torch kernel table, but the recurrent kernel leaves tokens outside its sequences as NaN (what `empty_like` may hold)."
    name = "empty-like"
    def __getattr__(self, slot):
        from solar_open2.vllm.kda import torch_kernels
        fn = getattr(torch_kernels(), slot)
        if slot != "recurrent": return fn
        def rec(*a, cu_seqlens=None, **kw):
            o, s = fn(*a, cu_seqlens=cu_seqlens, **kw)
            o[:, int(cu_seqlens[-1]):] = float("nan")
            return o, s
        return rec


@pytest.mark.parametrize("step", ["verify", "decode"])
def test_graph_padding_tokens_leave_the_op_as_zeros(spec_bench, step):
    """A step as a full CUDA graph replays it: one real request (a verify of 1+3 tokens, or a one-token decode on the
    plain path), then a padding request (the null slot, no tokens) and its padding tokens; the recurrent kernel writes
    nothing for them. The op's output is the real request's (equal to the unpadded step's) and exactly zero on the
    padding, never the kernel's leftovers."""
    import dataclasses
    from solar_open2.vllm.testing import gdn_step
    b = spec_bench
    A = [1, 2, 3, 4]
    outs = []
    for pad in (False, True):
        layer = kda_layer(b.vc, b.W, f"model.layers.{next(b.n)}.self_attn", kernels=_EmptyLikeKernels(), slots=9)
        torch.manual_seed(3)
        x = torch.randn(5 + 4, 256)
        with torch.no_grad():
            run_layer(layer, x[:5], gdn_step(b.vc, [5], [0], [A]), b.vc)
            if step == "verify":
                md, xs, real = gdn_step(b.vc, [4], [5], [A], drafts=[3], num_accepted=[1]), x[5:9], 4
                if pad:
                    md = dataclasses.replace(md, num_actual_tokens=8, spec_query_start_loc=torch.tensor([0, 4, 4], dtype=torch.int32),
                                             spec_state_indices_tensor=torch.tensor([A, [0, 0, 0, 0]], dtype=torch.int32),
                                             num_accepted_tokens=torch.tensor([1, 1], dtype=torch.int32), num_spec_decodes=2,
                                             spec_token_indx=torch.arange(8, dtype=torch.int32))
            else:
                md, xs, real = gdn_step(b.vc, [1], [5], [A]), x[5:6], 1
                assert md.spec_sequence_masks is None and md.num_decodes == 1
                if pad:
                    md = dataclasses.replace(md, num_actual_tokens=2, non_spec_query_start_loc=torch.tensor([0, 1, 1], dtype=torch.int32),
                                             non_spec_state_indices_tensor=torch.tensor([A[0], 0], dtype=torch.int32))
            if pad: xs = torch.cat([xs, torch.randn(md.num_actual_tokens - real, 256)])
            outs.append(run_layer(layer, xs, md, b.vc))
    from solar_open2.kda import rel_rms
    assert outs[1].shape[0] > real and torch.isfinite(outs[1]).all() and (outs[1][real:] == 0).all()
    if step == "verify": assert torch.equal(outs[1][:real], outs[0])
    else: assert rel_rms(outs[1][:real], outs[0]) <= 1e-6                        # the projections ran at another batch size


def test_a_full_graph_replay_of_a_padded_verify_batch_equals_the_unpadded_batch(spec_bench):
    """A full CUDA graph keeps what its capture saw: the metadata's ints (4 verifies, 16 tokens, from vLLM's
    `build_for_cudagraph_capture`) and the addresses of the builder's persistent buffers, which the replay's `build`
    refills (3 real verifies, the 4th a padding request on the null block with no tokens). The op run on the capture's
    metadata after the replay's build (what the graph computes) equals the unpadded step eagerly: outputs, every state
    slot, the null block untouched, zeros on the padding tokens (the recurrent kernel leaves them NaN, as `empty_like` may
    on the GPU). So the KDA op is not what faults in the GPU's
    full-graph batched verifies (chapter vllm/model)."""
    from unittest import mock as _m
    import vllm.utils.torch_utils as tu, vllm.v1.attention.backends.utils as bu
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from solar_open2.vllm.testing import _bench_builder, _step_extras
    b, K = spec_bench, 3
    builder, _ = _bench_builder(b.vc, K)
    def common(ql, done, rows, T):                                              # the runner's per-step metadata
        ql, done = torch.tensor(ql, dtype=torch.int32), torch.tensor(done, dtype=torch.int32)
        qsl = torch.zeros(len(ql) + 1, dtype=torch.int32); qsl[1:] = ql.cumsum(0)            # [reqs + 1]
        return CommonAttentionMetadata(query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=done + ql, num_reqs=len(ql),
            num_actual_tokens=T, max_query_len=int(ql.max()), max_seq_len=int((done + ql).max()),
            block_table_tensor=torch.tensor(rows, dtype=torch.int32), slot_mapping=torch.zeros(T, dtype=torch.int64),
            **_step_extras(CommonAttentionMetadata, ql, done, [K] * len(ql)))
    R, T = 4, 4 * (K + 1)
    rows = [[1 + 4 * r + i for i in range(4)] for r in range(R)]                # [R, 1 + K] slots
    nacc, drafts = torch.tensor([2, 1, 3, 1], dtype=torch.int32), torch.tensor([K, K, K, -1], dtype=torch.int32)
    layer = kda_layer(b.vc, b.W, f"model.layers.{next(b.n)}.self_attn", kernels=_EmptyLikeKernels(), slots=1 + 4 * R)   # padding: NaN
    torch.manual_seed(5)
    for t in layer.kv_cache: t.normal_()
    start = [t.clone() for t in layer.kv_cache]
    x = torch.randn(T, 256)                                                     # [16, hidden]: 12 real tokens, 4 padding
    with _m.patch.object(tu, "PIN_MEMORY", False), _m.patch.object(bu, "PIN_MEMORY", False), \
         _m.patch.object(builder, "use_full_cuda_graph", True):
        cap = builder.build_for_cudagraph_capture(common([K + 1] * R, [10] * R, rows, T))
        builder.build(0, common([K + 1] * 3 + [0], [10] * 3 + [0], rows[:3] + [[0] * 4], T),
                      num_accepted_tokens=nacc, num_decode_draft_tokens_cpu=drafts)             # the replay's step
    assert (cap.num_spec_decodes, cap.num_actual_tokens) == (R, T)              # the ints the graph keeps
    assert cap.spec_state_indices_tensor[3].tolist() == [0] * 4 and cap.spec_query_start_loc.tolist() == [0, 4, 8, 12, 12]
    with torch.no_grad():
        y = run_layer(layer, x, cap, b.vc)
        graph = [t.clone() for t in layer.kv_cache]
        for t, s0 in zip(layer.kv_cache, start): t.copy_(s0)
        with _m.patch.object(tu, "PIN_MEMORY", False), _m.patch.object(bu, "PIN_MEMORY", False):
            eager = builder.build(0, common([K + 1] * 3, [10] * 3, rows[:3], 12), num_accepted_tokens=nacc[:3],
                                  num_decode_draft_tokens_cpu=drafts[:3])
        want = run_layer(layer, x[:12], eager, b.vc)
    assert torch.equal(y[:12], want) and (y[12:] == 0).all()
    for g, e, s0 in zip(graph, layer.kv_cache, start):
        assert torch.equal(g, e) and torch.equal(g[0], s0[0])                   # every slot as eager; the null block untouched
        assert not torch.equal(g[1:13], s0[1:13])                               # the step did write the real requests' slots


def test_spec_verify_through_the_recording_kernels(spec_bench):
    "A pure verify step calls the conv update and the recurrent kernel with the spec metadata, the gate once, and no prefill kernel."
    from solar_open2.vllm.testing import gdn_step
    b = spec_bench
    rec = RecordingKernels()
    layer = kda_layer(b.vc, b.W, f"model.layers.{next(b.n)}.self_attn", kernels=rec, slots=9)
    x = torch.randn(8, 256)
    run_layer(layer, x[:4], gdn_step(b.vc, [4], [0], [[1, 2, 3, 4]]), b.vc)
    rec.calls.clear()
    run_layer(layer, x[4:8], gdn_step(b.vc, [3, 1], [4, 4], [[1, 2, 3, 4], [5, 6, 7, 8]], drafts=[2, 0], num_accepted=[1, 1]), b.vc)
    assert rec.slots() == ["conv_decode", "gate", "recurrent"]
    conv_kw, rec_kw = rec.calls[0][2], rec.calls[2][2]
    assert conv_kw["conv_state_indices"].tolist() == [1, 5] and conv_kw["query_start_loc"].tolist() == [0, 3, 4]
    assert conv_kw["num_accepted_tokens"].tolist() == [1, 1] and conv_kw["max_query_len"] == 4
    assert rec_kw["ssm_state_indices"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]] and rec_kw["cu_seqlens"].tolist() == [0, 3, 4]


_TRITON_VERIFY = r'''
import json, torch
import torch.nn.functional as F
from solar_open2.vllm.testing import force_cpu_platform
force_cpu_platform()
import importlib, triton.language as tl
from solar_open2.vllm.compat import fused_recurrent_kda
fr = importlib.import_module(fused_recurrent_kda.__module__.rsplit('.', 1)[0] + '.fused_recurrent')   # the kernel's module, beside kda
fr.exp = lambda x: tl.exp(x)   # the kernel module binds tl.exp at import; the interpreter patches tl only at run time
from solar_open2.vllm.kda import torch_kernels, fused_recurrent_kda_spec, kda_beta
from unittest import mock
from vllm.platforms import current_platform
with mock.patch.object(type(current_platform), "is_cpu", lambda self: False):   # 0.33.0 rebinds the name to a CPU op on the CPU platform
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
assert hasattr(causal_conv1d_update, "__module__") and "cpu" not in causal_conv1d_update.__module__, causal_conv1d_update.__module__
torch.manual_seed(0)
T, H, D, dim, K, ns = 5, 2, 16, 32, 4, 3
rows = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32)
nacc, qsl = torch.tensor([2, 3], dtype=torch.int32), torch.tensor([0, 3, 5], dtype=torch.int32)
q, k, v, g = (torch.randn(1, T, H, D) for _ in range(4)); g = -F.softplus(g)
beta = kda_beta(torch.randn(1, T, H))
pool = torch.randn(9, H, D, D); p1, p2 = pool.clone(), pool.clone()
kw = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=qsl, ssm_state_indices=rows, num_accepted_tokens=nacc)
o1, _ = torch_kernels().recurrent(q=q, k=k, v=v, g=g, beta=beta, initial_state=p1, **kw)
o2, _ = fused_recurrent_kda_spec(q=q, k=k, v=v, g=g, beta=beta, initial_state=p2, **kw)
x, w, cs = torch.randn(T, dim), torch.randn(dim, K), torch.randn(9, dim, K - 1 + ns); c1, c2 = cs.clone(), cs.clone()
ckw = dict(conv_state_indices=rows[:, 0], num_accepted_tokens=nacc, query_start_loc=qsl, max_query_len=4)
y1 = torch_kernels().conv_decode(x.clone(), c1, w, None, activation="silu", **ckw)
y2 = causal_conv1d_update(x.clone(), c2, w, None, "silu", validate_data=False, **ckw)
M = K - 1
print(json.dumps({"o": (o1 - o2).abs().max().item(), "state": (p1 - p2).abs().max().item(), "untouched": (p2[[0, 4, 7, 8]] - pool[[0, 4, 7, 8]]).abs().max().item(),
                  "y": (y1 - y2).abs().max().item(), "rows": max((c1[s, :, :M - 1 + L] - c2[s, :, :M - 1 + L]).abs().max().item() for s, L in ((1, 3), (5, 2))),
                  "o_scale": o1.abs().max().item(), "changed": (p1 - pool).abs().max().item()}))
'''


def test_vllms_triton_verify_kernels_match_the_torch_table():
    """vLLM's Triton kernels (each supported release), under Triton's interpreter on the CPU: `fused_recurrent_kda_fwd` with
    `num_accepted_tokens` (through `fused_recurrent_kda_spec`) and `causal_conv1d_update` on a widened conv state give
    the torch table's outputs, per-token states and conv rows: the torch table is the Triton path's oracle."""
    import json
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}   # an empty device list: vLLM keeps Triton on with no driver
    r = subprocess.run([sys.executable, "-c", _TRITON_VERIFY], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["changed"] > 0.1 and d["o_scale"] > 0.1                              # the step did write states and outputs
    assert d["o"] <= 1e-5 and d["state"] <= 1e-5 and d["y"] <= 1e-5 and d["rows"] <= 1e-5, d
    assert d["untouched"] == 0.0, d                                                # slots past each verify's tokens (4; 7, 8) and the null block


_TRITON_WALK = r'''
import importlib, json, torch
from unittest import mock
from solar_open2.vllm.testing import force_cpu_platform
force_cpu_platform()
import triton.language as tl
from vllm.platforms import current_platform
from solar_open2.vllm.compat import fused_recurrent_kda
fr = importlib.import_module(fused_recurrent_kda.__module__.rsplit('.', 1)[0] + '.fused_recurrent')
fr.exp = lambda x: tl.exp(x)   # the kernel module binds tl.exp at import; the interpreter patches tl only at run time
with mock.patch.object(type(current_platform), "is_cpu", lambda self: False):   # the Triton update, not 0.33.0's CPU op
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
from solar_open2.vllm.kda import KDAKernels, fused_recurrent_kda_spec, torch_kernels
from solar_open2.vllm.testing import kda_layer, kda_spec_bench, spec_walk
b, tk = kda_spec_bench(3), torch_kernels()
layer = kda_layer(b.vc, b.W, "model.layers.101.self_attn", slots=5)
layer.kernels = KDAKernels("triton-mixed", tk.conv_prefill, causal_conv1d_update, tk.chunk, tk.gate, fused_recurrent_kda_spec)
print(json.dumps(spec_walk(layer, b, 1, steps=12, seed=31)))
'''


@pytest.mark.slow
def test_a_random_walk_through_vllms_triton_kernels_follows_the_reference():
    """The random walk above (one request, as the GPU run's failing case), the layer running vLLM's Triton conv update and
    recurrent kernel under Triton's interpreter on the CPU (the gate and the prefill in torch: autotuned kernels need a
    GPU to tune): every step's output equals the reference's (fp32, <= 1e-5), draft-less steps after accepted drafts among them."""
    import json
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", _TRITON_WALK], capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["plain_after_accepts"] >= 1 and d["worst"] <= 1e-5, d
