"""Where chapter 08k's routing kernel spends its time at one token (real router shapes, one GPU, L2-cold weights):
the kernel with top_k = 1, 2, 4, 8 (the tail's rounds), against chapter 08i's GEMV alone on the same fp32 weights
(x cast first, as the engine did). Prints one JSON line per timing; run from the repository root."""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2])); sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
from kernel_bench import time_graph
from solar_open2.vllm import moe_router as mr
from solar_open2.vllm.gemv import gemv
E, K, copies = 320, 4096, 40
g = torch.Generator(device="cuda").manual_seed(0)
W = [torch.randn(E, K, generator=g, device="cuda") / K ** 0.5 for _ in range(copies)]
B = [0.05 * torch.randn(E, generator=g, device="cuda") for _ in range(copies)]
C = [torch.zeros(1, dtype=torch.int32, device="cuda") for _ in range(copies)]
for T in (1, 4):
    xs = [torch.randn(T, K, generator=g, device="cuda").to(torch.bfloat16) for _ in range(copies)]
    tile = mr.route_tile_for(T)
    print(json.dumps({"tokens": T, "kind": "gemv_08i", "us": round(time_graph([lambda x=x, w=w: gemv(x.float(), w) for x, w in zip(xs, W)], 50), 2)}))
    for k in (1, 2, 4, 8):
        us = time_graph([lambda x=x, w=w, b=b, c=c: mr.route_triton(x, w, b, k, counter=c, tile=tile) for x, w, b, c in zip(xs, W, B, C)], 50)
        print(json.dumps({"tokens": T, "kind": "route_kernel", "top_k": k, "tile": list(tile), "us": round(us, 2)}))
