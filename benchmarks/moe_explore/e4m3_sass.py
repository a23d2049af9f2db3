"""Offline (no GPU): how many SASS instructions 16 E2M1 codes cost in chapter 08f's half2 dot, against a decode
through FP8 E4M3 and the hardware conversion `cvt.rn.f16x2.e4m3x2` (sm_89 and later), and against Blackwell's
`cvt.rn.f16x2.e2m1x2` (sm_100a / sm_120a: B200, and GB10, the DGX Spark's GPU).

    python benchmarks/moe_explore/e4m3_sass.py [ARCH,ARCH...]    (default 90,120)

Today's `dot16` (08f, `DOT16_PTX`) turns each pair of codes (c, c+4) of a 32-bit word into an fp16x2 pattern with two
shifts, two masks and an OR, then one `fma.rn.f16x2` with the matching activation pair. The alternative: an E2M1
code `s e1 e0 m` placed in a byte as `s 0 0 0 e1 e0 m 0 0`, that is `(s << 7) | (e1 e0 m << 2)`, is an E4M3 byte whose
value is the code's times 2^-6 exactly (normal: 2^(E-7)(1 + m/2) against 2^(E-1)(1 + m/2); subnormal: 2^-6 · m/2
against m/2). For a word of 8 codes the even codes' bytes are `((w << 2) & 0x1C1C1C1C) | ((w << 4) & 0x80808080)`
and the odd codes' `((w >> 2) & 0x1C1C1C1C) | (w & 0x80808080)`; each 16-bit half then goes through one
`cvt.rn.f16x2.e4m3x2` and one `fma.rn.f16x2`. The activation pairs become (x0, x2), (x4, x6), (x1, x3), (x5, x7)
per word instead of (x_c, x_c+4), and their block scale must keep 8 products of up to 6 · 2^-6 · |x·s| inside fp16.

On sm_100 and later one `cvt.rn.f16x2.e2m1x2` turns a byte of two codes into an fp16x2 pair, unscaled: the pairs
become (x_2j, x_2j+1), and the block scale must keep 8 products of up to 6 · |x·s| inside fp16 (|x·s| below 2^10).

The dots are compiled here, inside the same minimal loop (one int64 block of codes and 8 pair registers per
iteration, fp32 sum), for sm_ARCH (default 90) with Triton's ptxas; the script counts the loop's SASS and its
instruction mix, and checks the E4M3 byte formula against torch's float8_e4m3fn for all 16 codes and all 256
bytes of two codes. A count, not a timing: the kernels are bound by instructions (08f's Nsight Compute notes), so
fewer instructions per code is the quantity to buy, but only a GPU run says what it is worth.

Output: benchmarks/moe_explore/results/e4m3_sass.json (and $OUT/ when set).
"""
import json, os, sys
from pathlib import Path
import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from solar_open2 import nvfp4                              # noqa: E402
from solar_open2.vllm.ops.nvfp4_dot import DOT16_PTX             # noqa: E402
from solar_open2.vllm.ops.sass import compiled_loop              # noqa: E402

_E4M3_WORD = """
shl.b32 t, {w}, 2; and.b32 t, t, 0x1C1C1C1C; shl.b32 u, {w}, 4; and.b32 u, u, 0x80808080; or.b32 e, t, u;
shr.b32 t, {w}, 2; and.b32 t, t, 0x1C1C1C1C; and.b32 u, {w}, 0x80808080; or.b32 o, t, u;
mov.b32 {{el, eh}}, e; mov.b32 {{ol, oh}}, o;
cvt.rn.f16x2.e4m3x2 a, el; {first};
cvt.rn.f16x2.e4m3x2 a, eh; fma.rn.f16x2 acc, a, {x1}, acc;
cvt.rn.f16x2.e4m3x2 a, ol; fma.rn.f16x2 acc, a, {x2}, acc;
cvt.rn.f16x2.e4m3x2 a, oh; fma.rn.f16x2 acc, a, {x3}, acc;"""
E4M3_PTX = tl.constexpr(
    "{ .reg .b32 w0, w1, t, u, e, o, a, acc; .reg .b16 el, eh, ol, oh, l, h; .reg .f32 fl, fh;\nmov.b64 {w0, w1}, $1;"
    + _E4M3_WORD.format(w="w0", first="mul.rn.f16x2 acc, a, $2", x1="$3", x2="$4", x3="$5")
    + _E4M3_WORD.format(w="w1", first="fma.rn.f16x2 acc, a, $6, acc", x1="$7", x2="$8", x3="$9")
    + "\nmov.b32 {l, h}, acc; cvt.f32.f16 fl, l; cvt.f32.f16 fh, h; add.f32 $0, fl, fh; }")

_E2M1_WORD = """
mov.b32 {{b0, b1, b2, b3}}, {w};
cvt.rn.f16x2.e2m1x2 a, b0; {first};
cvt.rn.f16x2.e2m1x2 a, b1; fma.rn.f16x2 acc, a, {x1}, acc;
cvt.rn.f16x2.e2m1x2 a, b2; fma.rn.f16x2 acc, a, {x2}, acc;
cvt.rn.f16x2.e2m1x2 a, b3; fma.rn.f16x2 acc, a, {x3}, acc;"""
E2M1_PTX = ("{ .reg .b32 w0, w1, a, acc; .reg .b8 b0, b1, b2, b3; .reg .b16 l, h; .reg .f32 fl, fh;\nmov.b64 {w0, w1}, $1;"
            + _E2M1_WORD.format(w="w0", first="mul.rn.f16x2 acc, a, $2", x1="$3", x2="$4", x3="$5")
            + _E2M1_WORD.format(w="w1", first="fma.rn.f16x2 acc, a, $6, acc", x1="$7", x2="$8", x3="$9")
            + "\nmov.b32 {l, h}, acc; cvt.f32.f16 fl, l; cvt.f32.f16 fh, h; add.f32 $0, fl, fh; }")
DOTS = {"dot16": (DOT16_PTX.value, 0), "e4m3": (E4M3_PTX.value, 89), "e2m1x2": (E2M1_PTX, 100)}   # PTX, lowest arch

@triton.jit
def dot_loop_kernel(w_ptr, p_ptr, o_ptr, NB, DOT:tl.constexpr, BLOCK:tl.constexpr):
    "Σ over NB/BLOCK iterations of BLOCK int64 code blocks · their 8 pair planes: the dot alone in a loop."
    i = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for b0 in range(0, NB, BLOCK):
        w = tl.load(w_ptr + b0 + i)
        X0 = tl.load(p_ptr + b0 + i)
        X1 = tl.load(p_ptr + NB + b0 + i)
        X2 = tl.load(p_ptr + 2 * NB + b0 + i)
        X3 = tl.load(p_ptr + 3 * NB + b0 + i)
        X4 = tl.load(p_ptr + 4 * NB + b0 + i)
        X5 = tl.load(p_ptr + 5 * NB + b0 + i)
        X6 = tl.load(p_ptr + 6 * NB + b0 + i)
        X7 = tl.load(p_ptr + 7 * NB + b0 + i)
        acc += tl.inline_asm_elementwise(DOT, "=f,l,r,r,r,r,r,r,r,r", [w, X0, X1, X2, X3, X4, X5, X6, X7],
                                         dtype=tl.float32, is_pure=True, pack=1)
    tl.store(o_ptr + i, acc)

CORE_OPS = ("LOP3", "IMAD", "SHF", "PRMT", "F2FP", "HFMA2")   # the decode and the packed FMAs (not addresses, loads, the sum)

def loop_sass(dot:str, arch:int=90, block:int=512, num_warps:int=4)->dict:
    "Compile `dot_loop_kernel` with `dot` for sm_`arch` (08f's `compiled_loop`) and count its loop's SASS per 16-code block per thread."
    sig = dict(w_ptr="*i64", p_ptr="*i32", o_ptr="*fp32", NB="i32", DOT="constexpr", BLOCK="constexpr")
    body, ops = compiled_loop(dot_loop_kernel, sig, dict(DOT=DOTS[dot][0], BLOCK=block), arch, num_warps)
    blocks = block // (32 * num_warps)                                  # 16-code blocks per thread per iteration
    loads = sum(v for k, v in ops.items() if k.startswith("LDG"))
    core = sum(v for k, v in ops.items() if k.split(".")[0] in CORE_OPS and not k.startswith("IMAD.WIDE"))
    return {"dot": dot, "arch": arch, "loop_instructions": len(body), "blocks_per_thread": blocks,
            "per_block": round(len(body) / blocks, 2), "per_block_without_loads": round((len(body) - loads) / blocks, 2),
            "decode_and_fma_per_block": round(core / blocks, 2), "ops": ops}

def e4m3_formula_check()->dict:
    "The byte formula against torch's E4M3 decode: every code alone, and every byte of two codes through both masks."
    ref = nvfp4.E2M1_VALUES                                              # the codec's values, by code
    byte = lambda c: ((c & 8) << 4) | ((c & 7) << 2)
    one = torch.tensor([byte(c) for c in range(16)], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    ok_one = bool(torch.equal(one * 64, ref))
    w = torch.arange(256, dtype=torch.int64)                            # a byte: code 2j low, code 2j+1 high
    even = (((w << 2) & 0x1C) | ((w << 4) & 0x80)).to(torch.uint8).view(torch.float8_e4m3fn).float() * 64
    odd = (((w >> 2) & 0x1C) | (w & 0x80)).to(torch.uint8).view(torch.float8_e4m3fn).float() * 64
    ok_pair = bool(torch.equal(even, ref[w & 15]) and torch.equal(odd, ref[w >> 4]))
    return {"codes": ok_one, "bytes_of_two_codes": ok_pair}

def main():
    archs = [int(a) for a in (sys.argv[1] if len(sys.argv) > 1 else "90,120").split(",")]
    res = {"benchmark": "moe_explore_e4m3_sass", "triton": triton.__version__, "torch": torch.__version__,
           "formula": e4m3_formula_check(), "loops": [loop_sass(d, a) for a in archs for d, (_, lo) in DOTS.items() if a >= lo]}
    base = {r["arch"]: r for r in res["loops"] if r["dot"] == "dot16"}
    res["over_dot16"] = [{"arch": r["arch"], "dot": r["dot"], **{k: round(r[k] / base[r["arch"]][k], 3)
                          for k in ("per_block_without_loads", "decode_and_fma_per_block")}} for r in res["loops"]]
    outs = [ROOT / "benchmarks" / "moe_explore" / "results" / "e4m3_sass.json"] + ([Path(os.environ["OUT"]) / "e4m3_sass.json"] if os.environ.get("OUT") else [])
    for p in outs: p.parent.mkdir(parents=True, exist_ok=True); p.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k not in ("loops", "over_dot16")}))
    for r in res["over_dot16"]: print(json.dumps(r))
    for r in res["loops"]: print(json.dumps({k: v for k, v in r.items() if k != "ops"}), list(r["ops"].items())[:10])

if __name__ == "__main__":
    main()
