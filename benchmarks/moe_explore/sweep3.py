import torch, sys, json, time, itertools, os
sys.path.insert(0, '.')
from benchmarks.moe_decode_h200 import random_experts, routing, REAL
from solar_open2.vllm.moe_decode import moe_decode_torch
from benchmarks.moe_explore import mdv2
from benchmarks.moe_explore.util import timeit
dev = 'cuda'; E, K, I, H, k = (REAL[x] for x in ("E", "K", "I", "H", "topk"))
w13, w2 = random_experts(E, K, I, H, dev)
R = 8; t0 = time.time(); out = {"rows": []}
def rec(**r):
    out["rows"].append(r); print(json.dumps(r), flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "sweep3.json"), "w"), indent=1)
for M in (1, 8):
    xs = [torch.randn(M, K, device=dev).bfloat16() for _ in range(R)]
    rts = [routing(M, E, k, dev, seed=100 * M + r) for r in range(R)]
    ref = moe_decode_torch(xs[0], *rts[0], w13, w2)
    got = mdv2.moe3(xs[0], *rts[0], w13, w2)
    rec(M=M, check=((got - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item())
    rec(M=M, v=2, us=timeit([lambda x=x, r=r: mdv2.moe2(x, *r, w13, w2, bn=(2, 16), bk=(512, 128), warps=(4, 4), stages=(3, 3)) for x, r in zip(xs, rts)]))
    res = []
    cfgs = list(itertools.product((2, 4, 8, 16), (256, 512), (4,), (1, 3), (1, 2, 4, 8))) if M == 1 else best
    for c in cfgs:
        if time.time() - t0 > float(sys.argv[1]): break
        try: us = timeit([lambda x=x, r=r: mdv2.moe3(x, *r, w13, w2, g=c) for x, r in zip(xs, rts)])
        except Exception as e: rec(M=M, cfg=c, err=str(e)[:200]); continue
        res.append((us, c)); rec(M=M, v=3, cfg=c, us=us)
    res.sort(); best = [c for _, c in res[:4]]
    for d in ((16, 128, 4, 3), (32, 128, 4, 3), (8, 128, 4, 3), (16, 64, 4, 3), (16, 128, 8, 3), (32, 128, 8, 1)):
        if time.time() - t0 > float(sys.argv[1]) + 30: break
        us = timeit([lambda x=x, r=r: mdv2.moe3(x, *r, w13, w2, g=best[0], d=d) for x, r in zip(xs, rts)])
        rec(M=M, v=3, cfg=best[0], d=d, us=us)
    rec(M=M, best=res[:5])
