"""The plugin's torch KDA kernels (the CPU path of `solar_open2.vllm.kda`, adapters over `solar_open2.kda`) against vLLM 0.25.1's Triton kernels, on a GPU.

The CPU tests hold the plugin's KDA layer to the math through the torch kernels; these hold the torch kernels to the
Triton kernels the layer calls on a GPU, with the same arguments the layer passes (varlen prefill across chunk
boundaries with initial states, in-place decode through state slots, conv states in vLLM's layout). Together: the
GPU path computes the math. End-to-end generation parity is `scripts/gpu_parity.py`.
"""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (vLLM's Triton kernels)")

H, D, K = 4, 128, 4


@pytest.fixture(scope="module")
def kernels():
    from solar_open2.vllm.kda import torch_kernels, triton_kernels
    return triton_kernels(), torch_kernels()


def _close(a, b, rel):
    a, b = a.float(), b.float()
    err, scale = (a - b).abs().max().item(), b.abs().max().item()
    assert err <= rel * max(scale, 1e-6), (err, scale)


def _inputs(T, dev="cuda", seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=dev, generator=g)
    from solar_open2.kda import kda_beta
    q, k, v, raw = (r(1, T, H, D).to(torch.bfloat16) for _ in range(4))
    beta = kda_beta(r(T, H))[None]                                              # [1, T, H] fp32, doubled
    A_log = torch.log(1 + 15 * torch.rand(1, 1, H, 1, device=dev, generator=g))
    dt_bias = r(H * D) - 3
    return q, k, v, raw, beta, A_log, dt_bias


def test_gate(kernels):
    tri, ref = kernels
    _, _, _, raw, _, A_log, dt_bias = _inputs(37)
    g = raw[0].reshape(37, H * D)
    _close(tri.gate(g, A_log, D, g_bias=dt_bias), ref.gate(g, A_log, D, g_bias=dt_bias), 1e-4)


def test_chunk_varlen_with_initial_state(kernels):
    tri, ref = kernels
    cu = torch.tensor([0, 5, 70, 200], dtype=torch.int32, device="cuda")      # 3 sequences, crossing 64-token chunks
    q, k, v, raw, beta, A_log, dt_bias = _inputs(200)
    h0 = torch.randn(3, H, D, D, device="cuda") * 0.1
    kw = dict(A_log=A_log, g_bias=dt_bias, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    o1, s1 = tri.chunk(q=q, k=k, v=v, raw_g=raw, beta=beta, initial_state=h0.clone(), **kw)
    o2, s2 = ref.chunk(q=q, k=k, v=v, raw_g=raw, beta=beta, initial_state=h0.clone(), **kw)
    _close(o1, o2, 2e-2)
    _close(s1, s2, 2e-2)


def test_recurrent_in_place_through_slots(kernels):
    tri, ref = kernels
    q, k, v, raw, beta, A_log, dt_bias = _inputs(3)
    g = ref.gate(raw[0].reshape(3, H * D), A_log, D, g_bias=dt_bias)[None]   # [1, 3, H, D] fp32
    pool = torch.randn(5, H, D, D, device="cuda") * 0.1
    p1, p2 = pool.clone(), pool.clone()
    idx, cu = torch.tensor([1, 4, 2], dtype=torch.int32, device="cuda"), torch.arange(4, dtype=torch.int32, device="cuda")
    kw = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu, ssm_state_indices=idx)
    o1, _ = tri.recurrent(q=q, k=k, v=v, g=g, beta=beta, initial_state=p1, **kw)
    o2, _ = ref.recurrent(q=q, k=k, v=v, g=g, beta=beta, initial_state=p2, **kw)
    _close(o1, o2, 1e-2)
    _close(p1, p2, 1e-3)
    assert torch.equal(p1[[0, 3]], pool[[0, 3]])                               # untouched slots stay


def test_chunk_then_recurrent_share_the_state_layout(kernels):
    "Prefill with the Triton chunk kernel, then decode with the torch recurrence from its state: the math of one pass."
    tri, ref = kernels
    q, k, v, raw, beta, A_log, dt_bias = _inputs(65)
    cu = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
    zero = torch.zeros(1, H, D, D, device="cuda")
    kw = dict(A_log=A_log, g_bias=dt_bias, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_all, _ = ref.chunk(q=q, k=k, v=v, raw_g=raw, beta=beta, initial_state=zero, cu_seqlens=torch.tensor([0, 65], dtype=torch.int32, device="cuda"), **kw)
    _, s = tri.chunk(q=q[:, :64], k=k[:, :64], v=v[:, :64], raw_g=raw[:, :64], beta=beta[:, :64], initial_state=zero, cu_seqlens=cu, **kw)
    pool = torch.cat([torch.zeros_like(s), s])                                 # slot 1 holds the prefill's state
    g = ref.gate(raw[0, 64:].reshape(1, H * D), A_log, D, g_bias=dt_bias)[None]
    o_last, _ = ref.recurrent(q=q[:, 64:], k=k[:, 64:], v=v[:, 64:], g=g, beta=beta[:, 64:], initial_state=pool,
                              use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor([0, 1], device="cuda"),
                              ssm_state_indices=torch.tensor([1], device="cuda"))
    _close(o_last[0, 0], o_all[0, 64], 2e-2)


def test_conv_prefill_and_decode(kernels):
    tri, ref = kernels
    dim, slots = 3 * H * D, 4
    x = torch.randn(dim, 11, device="cuda").to(torch.bfloat16)                # two sequences: 7 and 4 tokens
    w = torch.randn(dim, K, device="cuda") / 2
    qsl = torch.tensor([0, 7, 11], dtype=torch.int32, device="cuda")
    idx = torch.tensor([2, 3], dtype=torch.int32, device="cuda")
    has = torch.tensor([False, True], device="cuda")
    store = torch.randn(slots, K - 1, dim, device="cuda").to(torch.bfloat16)   # vLLM's default SD layout ...
    s1, s2 = store.clone(), store.clone()
    kw = dict(activation="silu", has_initial_state=has, cache_indices=idx, query_start_loc=qsl)
    y1 = tri.conv_prefill(x, w, None, conv_states=s1.transpose(-1, -2), **kw)  # ... seen as [slots, dim, K-1]
    y2 = ref.conv_prefill(x, w, None, conv_states=s2.transpose(-1, -2), **kw)
    _close(y1, y2, 2e-2)
    assert torch.equal(s1, s2)
    xd = torch.randn(2, dim, device="cuda").to(torch.bfloat16)
    d1 = tri.conv_decode(xd, s1.transpose(-1, -2), w, None, activation="silu", conv_state_indices=idx)
    d2 = ref.conv_decode(xd, s2.transpose(-1, -2), w, None, activation="silu", conv_state_indices=idx)
    _close(d1, d2, 2e-2)
    assert torch.equal(s1, s2)
