import torch, sys; sys.path.insert(0, '.')
from solar_open2.vllm.moe_decode import quantized_experts, moe_decode_torch, CHECK_CASES
from benchmarks.moe_explore.mdv2 import moe3
for i, (E, K, I, H, M, k, bn, bk) in enumerate(CHECK_CASES + ((7, 64, 32, 48, 2, 5, 16, 32),)):
    g = torch.Generator().manual_seed(i)
    w13, w2 = quantized_experts(E, K, I, H, generator=g)
    x = torch.randn(M, K, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)])
    wt = torch.rand(M, k, generator=g)
    ref = moe_decode_torch(x, ids, wt, w13, w2)
    out = moe3(x, ids, wt, w13, w2, g=(bn, bk, 4, 1, 2), d=(bn, bk, 4, 1))
    print((out - ref).pow(2).mean().sqrt().item() / ref.pow(2).mean().sqrt().item())
