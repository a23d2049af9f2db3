"""The serving budget pinned to the engine: vLLM 0.25.1's own functions, run on CPU, must give the numbers
`solar_open2.budget` computes.

What runs for real: `human_readable_int` (the `--kv-cache-memory-bytes` parser), `MambaStateShapeCalculator.kda_state_shape`
and `MambaStateDtypeCalculator.kda_state_dtype`, `MambaSpec` / `FullAttentionSpec` page sizes,
`MambaModelConfig.verify_and_update_config` (prefix caching -> mamba cache mode), `Platform._align_hybrid_block_size`
(the attention block size and the padded page) with the real FlashAttention backend class, and `get_kv_cache_configs`
+ `get_kv_cache_capacity` (grouping, blocks, the two logged numbers, and the "cannot serve one request" refusal).
What is stubbed: the model config and parallel config (plain namespaces carrying the values vLLM reads from them), and
the model-class lookup (a class whose state-shape classmethods call vLLM's KDA calculators, as Solar's model class does),
because building a real `ModelConfig` needs the model registered and a GPU platform. With speculative tokens the
stub declares the conv state widened by them, through vLLM's Gated DeltaNet calculator (the same `3*H*D` conv
channels; 0.25.1's KDA calculator ignores `num_spec`), which is what a KDA layer that verifies drafts must declare.
"""
import types

import pytest

from solar_open2.budget import (attn_bytes_per_token, capture_sizes_for, kda_state_bytes, kda_state_shapes, kv_capacity,
                                kv_layout, max_fitting_len, parse_size, rank_shape, vllm_capture_sizes)
from solar_open2.config import FULL, SolarOpen2Config, tensor_specs

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm.config import CacheConfig  # noqa: E402
from vllm.model_executor.layers.mamba.mamba_utils import (MambaStateDtypeCalculator,  # noqa: E402
                                                          MambaStateShapeCalculator)
from vllm.model_executor.layers.vocab_parallel_embedding import DEFAULT_VOCAB_PADDING_SIZE, pad_vocab_size  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.model_executor.models.config import MambaModelConfig  # noqa: E402
from vllm.platforms.interface import Platform  # noqa: E402
from vllm.utils.argparse_utils import human_readable_int  # noqa: E402
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # noqa: E402
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.core import kv_cache_utils as kcu  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, get_kv_quant_mode  # noqa: E402
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum  # noqa: E402

REAL, TINY = SolarOpen2Config.real(), SolarOpen2Config.tiny()


def _engine(cfg, tp, kv_cache_dtype, block_size, prefix_caching, max_model_len, monkeypatch, num_spec=0):
    "A vLLM config skeleton for `cfg` with the hybrid alignment done by vLLM itself; returns (vllm_config, specs)."
    lac = cfg.linear_attn_config

    class SolarLike:  # what Solar's model class answers to `_align_hybrid_block_size`
        @classmethod
        def get_mamba_state_shape_from_config(cls, vc):
            tp_, H, D, K = vc.parallel_config.tensor_parallel_size, lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
            if num_spec:   # the conv window widened by the drafts: 3*H*D channels, as Gated DeltaNet declares them
                return MambaStateShapeCalculator.gated_delta_net_state_shape(tp_, H, H, D, D, K, num_spec)
            return MambaStateShapeCalculator.kda_state_shape(tp_, H, D, conv_kernel_size=K)

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vc):
            return MambaStateDtypeCalculator.kda_state_dtype(vc.model_config.dtype, vc.cache_config.mamba_cache_dtype)

    monkeypatch.setattr(ModelRegistry, "resolve_model_cls", lambda arch, model_config=None: (SolarLike, arch))
    cc = CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype, enable_prefix_caching=prefix_caching)
    pc = types.SimpleNamespace(tensor_parallel_size=tp, decode_context_parallel_size=1, prefill_context_parallel_size=1)
    mc = types.SimpleNamespace(
        use_mla=False, dtype=torch.bfloat16, architecture=cfg.architectures[0], max_model_len=max_model_len,
        original_max_model_len=max_model_len, supports_mamba_prefix_caching=False,
        get_num_kv_heads=lambda p: max(1, cfg.num_key_value_heads // p.tensor_parallel_size),
        get_head_size=lambda: cfg.head_dim, get_mamba_chunk_size=lambda: None)
    spec = types.SimpleNamespace(num_speculative_tokens=num_spec) if num_spec else None
    vc = types.SimpleNamespace(cache_config=cc, model_config=mc, parallel_config=pc, speculative_config=spec,
                               scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False,
                                                                      enable_chunked_prefill=True),
                               kv_transfer_config=None)
    MambaModelConfig.verify_and_update_config(vc)          # prefix caching -> mamba cache mode, mamba block size
    Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
    kv_dtype = torch.bfloat16 if kv_cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[kv_cache_dtype]
    specs = {}
    for i, t in enumerate(cfg.layer_types):
        if t == FULL:
            specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                block_size=cc.block_size, num_kv_heads=mc.get_num_kv_heads(pc), head_size=cfg.head_dim,
                dtype=kv_dtype, kv_quant_mode=get_kv_quant_mode(kv_cache_dtype))
        else:
            specs[f"model.layers.{i}.self_attn"] = MambaSpec(
                shapes=tuple(SolarLike.get_mamba_state_shape_from_config(vc)),
                dtypes=SolarLike.get_mamba_state_dtype_from_config(vc), block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded, mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
                mamba_cache_mode=cc.mamba_cache_mode, num_speculative_blocks=num_spec)
    return vc, specs


@pytest.mark.parametrize("s", ["8g", "8G", "28000000000", "25.6k", "1M", "1m", " 4t ", "0", "-5", "1_000", "0.3g"])
def test_parse_size_is_human_readable_int(s):
    assert parse_size(s) == human_readable_int(s)


@pytest.mark.parametrize("s", ["1.5G", "28e9", "8gb", ""])
def test_parse_size_refuses_what_vllm_refuses(s):
    with pytest.raises(Exception):
        human_readable_int(s)
    with pytest.raises(ValueError):
        parse_size(s)


@pytest.mark.parametrize("cfg,tp", [(REAL, 1), (REAL, 2), (REAL, 4), (REAL, 16), (TINY, 1), (TINY, 2), (TINY, 4)])
def test_state_and_page_sizes(cfg, tp):
    lac = cfg.linear_attn_config
    shapes = MambaStateShapeCalculator.kda_state_shape(tp, lac["num_heads"], lac["head_dim"],
                                                       conv_kernel_size=lac["short_conv_kernel_size"])
    dtypes = MambaStateDtypeCalculator.kda_state_dtype(torch.bfloat16, "auto")
    assert tuple(map(tuple, shapes)) == kda_state_shapes(cfg, tp)
    assert dtypes == (torch.bfloat16, torch.float32)
    assert MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes == sum(kda_state_bytes(cfg, tp))
    for kvd in ("auto", "fp8", "fp8_e5m2", "float16"):
        dt = torch.bfloat16 if kvd == "auto" else STR_DTYPE_TO_TORCH_DTYPE[kvd]
        spec = FullAttentionSpec(block_size=1, num_kv_heads=max(1, cfg.num_key_value_heads // tp),
                                 head_size=cfg.head_dim, dtype=dt, kv_quant_mode=get_kv_quant_mode(kvd))
        assert spec.page_size_bytes == attn_bytes_per_token(cfg, tp, kvd)


ODD_VOCAB = SolarOpen2Config.from_dict({**TINY.to_dict(), "vocab_size": 1029})   # padded to 1088 by vLLM


@pytest.mark.parametrize("cfg,tp", [(REAL, 2), (REAL, 8), (TINY, 4), (ODD_VOCAB, 1), (ODD_VOCAB, 4)])
def test_vocab_parallel_rows(cfg, tp):
    "VocabParallelEmbedding / ParallelLMHead: vocab padded to vLLM's 64, then split evenly."
    for spec in (s for s in tensor_specs(cfg) if s.group in ("embed", "lm_head")):
        assert rank_shape(spec, cfg, tp)[0] == pad_vocab_size(cfg.vocab_size, DEFAULT_VOCAB_PADDING_SIZE) // tp


CASES = [  # cfg, tp, kv dtype, --block-size, prefix caching, pool bytes, max_model_len[, speculative tokens]
    (REAL, 2, "auto", 16, False, 28_000_000_000, 1_048_576),
    (REAL, 2, "auto", 16, False, 8_000_000_000, 262_144),
    (REAL, 2, "auto", 16, False, 8 * 2**30, 262_144),
    (REAL, 2, "fp8", 16, False, 28_000_000_000, 1_048_576),
    (REAL, 2, "auto", 16, True, 28_000_000_000, 1_048_576),
    (REAL, 2, "auto", 32, False, 28_000_000_000, 1_048_576),
    (REAL, 1, "auto", 16, False, 60_000_000_000, 131_072),
    (REAL, 4, "fp8", 16, True, 12_345_678_901, 500_000),
    (REAL, 16, "auto", 16, False, 7_000_000_000, 1_048_576),   # KV heads replicated
    (TINY, 1, "auto", 16, False, 100_000_000, 8192),
    (TINY, 2, "fp8", 16, True, 50_000_000, 4000),
    (TINY, 4, "auto", 64, False, 30_000_000, 8192),
    (REAL, 2, "fp8", 16, False, 8_000_000_000, 262_144),        # the FP8 predictions the GPU run checks
    (REAL, 2, "fp8", 16, True, 28_000_000_000, 1_048_576),
    (REAL, 2, "fp8", 16, True, 8_000_000_000, 262_144),
    (REAL, 2, "fp8_e5m2", 16, False, 28_000_000_000, 1_048_576),
    (REAL, 2, "auto", 16, False, 28_000_000_000, 1_048_576, 3),  # speculative decoding: 3 draft tokens
    (REAL, 2, "fp8", 16, True, 28_000_000_000, 1_048_576, 3),
    (REAL, 2, "auto", 16, True, 8_000_000_000, 262_144, 1),
    (REAL, 4, "fp8", 16, False, 40_000_000_000, 1_048_576, 7),
    (TINY, 1, "auto", 16, True, 50_000_000, 4096, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"tp{c[1]}-{c[2]}-bs{c[3]}-pc{int(c[4])}-{c[5]}-{c[6]}"
                                                     + (f"-spec{c[7]}" if len(c) > 7 else ""))
def test_pool_matches_vllm(case, monkeypatch):
    cfg, tp, kvd, bs, pc, M, L, k = (*case, 0)[:8]
    vc, specs = _engine(cfg, tp, kvd, bs, pc, L, monkeypatch, k)
    lay = kv_layout(cfg, tp, kvd, bs, pc, num_speculative_tokens=k)
    assert (lay.block_size, lay.page_bytes, lay.mamba_cache_mode) == (
        vc.cache_config.block_size, vc.cache_config.mamba_page_size_padded or lay.page_bytes, vc.cache_config.mamba_cache_mode)
    (kvc,) = kcu.get_kv_cache_configs(vc, [specs], [M])
    tokens, conc = kcu.get_kv_cache_capacity(vc, kvc)
    groups = kvc.kv_cache_groups
    assert len(groups) == lay.n_attn_groups + lay.n_kda_groups
    assert max(len(g.layer_names) for g in groups) == lay.group_size
    ours = kv_capacity(lay, M, L)
    assert ours["fits"]
    assert ours["num_blocks"] == kvc.num_blocks
    assert ours["gpu_kv_cache_tokens"] == tokens
    assert ours["max_concurrency"] == pytest.approx(conc, rel=1e-15)
    assert ours["log_max_concurrency"] == f"Maximum concurrency for {L:,} tokens per request: {conc:.2f}x"
    assert ours["log_kv_cache_size"] == f"GPU KV cache size: {tokens:,} tokens"


def test_published_lines_from_vllm(monkeypatch):
    "The acceptance numbers, computed by vLLM's functions alone."
    vc, specs = _engine(REAL, 2, "auto", 16, False, 1_048_576, monkeypatch)
    assert vc.cache_config.block_size == 1072
    (kvc,) = kcu.get_kv_cache_configs(vc, [specs], [human_readable_int("28000000000")])
    tokens, conc = kcu.get_kv_cache_capacity(vc, kvc)
    assert (f"{tokens:,}", f"{conc:.2f}x") == ("1,133,999", "1.08x")
    vc, specs = _engine(REAL, 2, "auto", 16, False, 262_144, monkeypatch)
    (kvc,) = kcu.get_kv_cache_configs(vc, [specs], [human_readable_int("8g")])
    assert f"{kcu.get_kv_cache_capacity(vc, kvc)[1]:.2f}x" == "1.22x"
    vc, _ = _engine(REAL, 2, "fp8", 16, False, 1_048_576, monkeypatch)
    assert vc.cache_config.block_size == 2128


@pytest.mark.parametrize("M", [2_000_000_000, 25_000_000_000, 25_900_000_000, 26_000_000_000])
def test_refusal_matches_vllm(M, monkeypatch):
    "vLLM refuses to start when one max_model_len request does not fit; `fits` says the same."
    vc, specs = _engine(REAL, 2, "auto", 16, False, 1_048_576, monkeypatch)
    ours = kv_capacity(kv_layout(REAL, 2), M, 1_048_576)
    try:
        kcu.get_kv_cache_configs(vc, [specs], [M])
        refused = False
    except ValueError as e:
        assert "To serve at least one request" in str(e)
        refused = True
    assert refused == (not ours["fits"])


@pytest.mark.parametrize("k", [1, 3, 7])
def test_speculative_state_shapes(k):
    "The widened KDA state equals vLLM's Gated DeltaNet state with the same channels, and its page."
    lac = REAL.linear_attn_config
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(2, lac["num_heads"], lac["num_heads"], lac["head_dim"],
                                                                   lac["head_dim"], lac["short_conv_kernel_size"], k)
    assert tuple(map(tuple, shapes)) == kda_state_shapes(REAL, 2, k)
    spec = MambaSpec(shapes=shapes, dtypes=(torch.bfloat16, torch.float32), block_size=-1, num_speculative_blocks=k)
    assert spec.page_size_bytes == sum(kda_state_bytes(REAL, 2, num_spec=k))


@pytest.mark.parametrize("kvd,pc,M,upper", [("auto", False, 20_000_000_000, 1_048_576), ("fp8", True, 5_000_000_000, 1_048_576),
                                            ("auto", False, 28_000_000_000, 1_048_576), ("auto", False, 30_000_000, 1_048_576)])
def test_max_fitting_len_matches_vllm(kvd, pc, M, upper, monkeypatch):
    vc, specs = _engine(REAL, 2, kvd, 16, pc, upper, monkeypatch)
    groups = kcu.get_kv_cache_groups(vc, dict(specs))
    assert max_fitting_len(kv_layout(REAL, 2, kvd, 16, pc), M, upper) == kcu._estimate_max_model_len_from_groups(vc, groups, M)


@pytest.mark.parametrize("seqs,k", [(1, 0), (8, 0), (8, 3), (64, 0), (512, 0)])
def test_capture_sizes_match_vllm(seqs, k):
    "vLLM's own default capture sizes, and ours passed as explicit sizes, as `VllmConfig._set_cudagraph_sizes` makes them."
    from vllm.config import CompilationConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    def sizes(explicit):
        cc = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
                               **({"cudagraph_capture_sizes": explicit} if explicit else {}))
        ns = types.SimpleNamespace(
            model_config=types.SimpleNamespace(enforce_eager=False), compilation_config=cc, performance_mode="balanced",
            scheduler_config=types.SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=8192),
            parallel_config=types.SimpleNamespace(tensor_parallel_size=2), num_speculative_tokens=k)
        VllmConfig._set_cudagraph_sizes(ns)
        return cc.cudagraph_capture_sizes
    assert sizes(None) == vllm_capture_sizes(seqs, k, 8192)
    assert sizes(capture_sizes_for(seqs, k)) == capture_sizes_for(seqs, k)
