"""Across chapters (config -> nvfp4 -> moe): a tiny-config MoE layer written to safetensors the way a checkpoint holds
it (BF16 names from `tensor_specs`, routed experts replaced by their NVFP4 tensors in either convention) loads back
through `SolarMoE.from_tensors` and computes exactly what dense experts built from the dequantized weights compute."""
import copy

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from solar_open2.config import SolarOpen2Config, tensor_specs
from solar_open2.moe import SolarMoE
from solar_open2.nvfp4 import CONVENTIONS, detect_convention, quantization_config, quantize, to_checkpoint

L = 2
PREFIX = f"model.layers.{L}.mlp."


def _layer_tensors(cfg, convention):
    "BF16 tensors for every MoE spec of layer L, routed experts replaced by NVFP4 tensors."
    g = torch.Generator().manual_seed(0)
    out = {}
    for s in tensor_specs(cfg, [L]):
        if ".mlp." not in s.name: continue
        t = torch.randn(*s.shape, generator=g) * (0.02 if s.group == "router" else 0.06)
        if s.name.endswith("e_score_correction_bias"): out[s.name] = (t * 5).float(); continue
        if s.group == "routed_expert" and convention != "bf16":
            module = s.name[: -len(".weight")]
            for k, v in to_checkpoint(quantize(t, input_amax=4.0, name=module), convention).items():
                out[f"{module}.{k}"] = v.contiguous()
        else:
            out[s.name] = t.bfloat16()
    return out


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_nvfp4_layer_roundtrip_through_safetensors(tmp_path, convention):
    cfg = SolarOpen2Config.tiny()
    tensors = _layer_tensors(cfg, convention)
    f = tmp_path / "layer.safetensors"
    save_file(tensors, str(f))
    with safe_open(str(f), framework="pt") as fh:
        loaded = {k: fh.get_tensor(k) for k in fh.keys()}
    assert detect_convention(loaded, quantization_config(convention, ["lm_head"])) == convention
    moe = SolarMoE.from_tensors(cfg, loaded, prefix=PREFIX, quantization_config=quantization_config(convention, []))
    assert moe.expert_format == convention
    assert moe.gate.e_score_correction_bias.dtype == torch.float32
    moe = moe.to(torch.bfloat16)
    dense = copy.deepcopy(moe).dequantize_experts(torch.bfloat16)
    x = torch.randn(3, 5, cfg.hidden_size, generator=torch.Generator().manual_seed(1)).bfloat16()
    with torch.no_grad():
        y, yd = moe(x), dense(x)
    assert y.dtype == torch.bfloat16 and torch.equal(y, yd)
    # the on-disk bytes of the routed experts are what the config counts for one layer
    routed = sum(t.numel() * t.element_size() for k, t in tensors.items() if ".experts." in k)
    assert routed == cfg.checkpoint_bytes("nvfp4", by_group=True)["routed_expert"] // cfg.num_hidden_layers


def test_bf16_layer_loads_and_assign_keeps_checkpoint_dtypes():
    cfg = SolarOpen2Config.tiny()
    tensors = _layer_tensors(cfg, "bf16")
    moe = SolarMoE.from_tensors(cfg, tensors, prefix=PREFIX, assign=True)
    assert moe.expert_format == "bf16"
    assert moe.experts[0].up_proj.weight.dtype == torch.bfloat16
    assert moe.gate.e_score_correction_bias.dtype == torch.float32
    assert moe.experts[0].up_proj.weight.data_ptr() == tensors[PREFIX + "experts.0.up_proj.weight"].data_ptr()
    with torch.no_grad():
        assert moe(torch.randn(4, cfg.hidden_size).bfloat16()).shape == (4, cfg.hidden_size)
