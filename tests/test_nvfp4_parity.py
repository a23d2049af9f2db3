"""Cross-check `solar_open2.nvfp4.quantize` against an independent implementation: compressed-tensors' own NVFP4
quantizer (what llm-compressor runs to produce checkpoints like Nota's), and its NVFP4 config schema.

Skipped when compressed-tensors is not installed (it comes with the `vllm` extra). Importing it pulls in
transformers, so this file is kept apart from the fast property tests.
"""
import pytest
import torch

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig
from compressed_tensors.quantization.lifecycle.forward_helpers import _quantize
from compressed_tensors.quantization.quant_scheme import NVFP4
from compressed_tensors.quantization.utils.helpers import calculate_qparams, calculate_range, generate_gparam

from solar_open2.nvfp4 import E2M1_VALUES, GROUP_SIZE, quantization_config, quantize, to_checkpoint, unpack_codes


def _ct_quantize(w):
    "compressed-tensors' NVFP4 weight path: global divisor, FP8 block scales, FP4 values, packed bytes."
    args = NVFP4["weights"]
    out, inp = w.shape
    blocks = w.reshape(out, inp // GROUP_SIZE, GROUP_SIZE)                      # [out, nb, 16]
    gdiv = generate_gparam(w.min(), w.max())                                     # [1] divisor
    scale, zp = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args, global_scale=gdiv)   # [out, nb]
    qmin, qmax = calculate_range(args, w.device)
    vals = _quantize(blocks, scale.unsqueeze(-1), None, qmin, qmax, args, global_scale=gdiv)    # [out, nb, 16]
    vals = vals.reshape(out, inp)
    return gdiv, scale, vals, pack_fp4_to_uint8(vals)


@pytest.mark.parametrize("shape,seed", [((64, 256), 0), ((256, 64), 1), ((128, 1280), 2)])
def test_matches_compressed_tensors_quantizer(shape, seed):
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.02
    q = quantize(w)
    gdiv, scale, vals, packed = _ct_quantize(w)
    # the global scale: our multiplier is the fp32 reciprocal of their divisor
    assert q.global_scale.item() == (1.0 / gdiv).item()
    # block scales, FP4 values and packed bytes are identical
    assert torch.equal(q.scale.float(), scale.float())
    assert torch.equal(E2M1_VALUES[unpack_codes(q.packed).long()], vals)
    assert torch.equal(q.packed, packed)
    # and their unpacker reads our bytes as the same values
    assert torch.equal(unpack_fp4_from_uint8(q.packed, *shape, dtype=torch.float32), vals)
    # the divisor we write reads back (vLLM: 1/divisor) to the same multiplier as theirs
    d = to_checkpoint(q, "compressed-tensors")["weight_global_scale"]
    assert (1.0 / d).item() == (1.0 / gdiv).item()


def test_quantization_config_validates():
    qc = quantization_config("compressed-tensors", ["lm_head", "re:.*mlp.gate$"])
    cfg = QuantizationConfig.model_validate(qc)
    g = cfg.config_groups["group_0"]
    for a in (g.weights, g.input_activations):
        assert (a.num_bits, a.type, a.strategy, a.group_size) == (4, "float", "tensor_group", 16)
    assert g.weights.dynamic is False and g.input_activations.dynamic == "local"
    assert cfg.ignore == ["lm_head", "re:.*mlp.gate$"]
    assert QuantizationArgs.model_validate(qc["config_groups"]["group_0"]["weights"]).group_size == 16
