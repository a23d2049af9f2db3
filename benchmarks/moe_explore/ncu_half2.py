"""One launch of each batch-1 MoE kernel (chapter 08f) at the real per-rank shapes, one token, for Nsight Compute:

    ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats \
        --section LaunchStats -k regex:moe_ python3 benchmarks/moe_explore/ncu_half2.py

The word decode's tiles of `TILES` and the half2 decode's best tiles of the sweep (moe_decode_h200_half2.json), in
that order: gate/up words, down words, gate/up half2, down half2. Two warm-up calls first (compilation), not profiled
apart from their kernels' names (use --launch-skip 4)."""
import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks"))
import torch
from moe_decode_h200 import REAL, random_experts, routing
from solar_open2.vllm import moe_decode as md

E, K, I, H, k = (REAL[x] for x in ("E", "K", "I", "H", "topk"))
w13, w2 = random_experts(E, K, I, H, "cuda")
x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
ids, wts = routing(1, E, k, "cuda")
pairs = [(md.Tile(1, 1024, 4, 2, words=True), md.Tile(16, 128, 4, 3, words=True)),
         (md.Tile(1, 2048, 4, 2, half2=True), md.Tile(8, 128, 4, 3, half2=True))]
for g, d in pairs: md.moe_decode_triton(x, ids, wts, w13, w2, gate_up=g, down=d)      # compile
torch.cuda.synchronize()
for g, d in pairs: md.moe_decode_triton(x, ids, wts, w13, w2, gate_up=g, down=d)      # profiled
torch.cuda.synchronize()
print("done")
