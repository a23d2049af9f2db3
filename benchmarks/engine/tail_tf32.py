"""The float32 tail, emulated on the CPU: does TF32 in the engine's Triton dots explain vLLM's top-k logprob drift at
long prompts (issue #32)?

On the GPU, a float32 engine still runs every `tl.dot` of vLLM's FLA KDA kernels (those without an explicit precision)
and of its Triton attention in TF32 unless `TRITON_F32_DEFAULT=ieee`: each operand keeps 10 mantissa bits, products are
accumulated in fp32. cuBLAS linears stay fp32 (torch leaves `allow_tf32` off). This script runs the fp32 reference
on the same sequence, exact and with the operands of the KDA chunked form's batched products (`kda`), of the
attention's einsums (`attention`), of both (`both`), of the routed experts' GEMMs (`experts`: a Triton fused MoE's
inputs), of the router's logits (`router`) or of all four (`all`) rounded to TF32 (`explicit`: the exact explicit attention, the control for the two attention
modes, which replace SDPA by it) (round to nearest, ties away, as `cvt.rna.tf32`),
and compares the log-probs at the generated positions as `parity.compare_lp` compares vLLM's: the chosen token and the
top-k of the emulated run, the worst entry named (position, token, its logprob).

    python -m benchmarks.engine.tail_tf32 [--lengths 700 4096] [--tokens 64] [--modes MODE ...] [--out DIR]

Writes `tail_tf32_cpu.json` (command, versions, commit, per length and mode the figures) into --out (default
benchmarks/results/incoming). No GPU; about 90 s for both lengths and every mode on two cores."""
import argparse, contextlib, json, platform, time
from pathlib import Path

from benchmarks.common import INCOMING, ROOT, command_line, git_commit, git_dirty, source_digest

TOPK = 20
MODES = ("explicit", "kda", "attention", "both", "experts", "router", "all")


def tf32(x):
    "x (fp32) rounded to TF32: 10 explicit mantissa bits, round to nearest with ties away from zero (`cvt.rna.tf32.f32`)."
    import torch
    if x.dtype != torch.float32: return x
    i = x.contiguous().view(torch.int32)
    r = ((i + 0x1000) & ~0x1FFF).view(torch.float32)                        # add half an ulp of TF32 to |x|, drop 13 bits
    return torch.where(torch.isfinite(x), r, x)                             # inf/nan unchanged


@contextlib.contextmanager
def tf32_dots(mode: str):
    """Inside the block, the reference's Triton-side products take TF32 operands: `kda` (torch.bmm / baddbmm /
    Tensor.baddbmm_ as `solar_open2.kda.kda_chunked` calls them), `attention` (torch.einsum as chapter attention calls
    it), `both`, or `exact` (nothing changed)."""
    import torch
    saved = {}
    def patch(obj, name, fn):
        saved[(obj, name)] = getattr(obj, name); setattr(obj, name, fn)
    if mode in ("kda", "both", "all"):
        bmm, baddbmm, baddbmm_ = torch.bmm, torch.baddbmm, torch.Tensor.baddbmm_
        patch(torch, "bmm", lambda a, b, **kw: bmm(tf32(a), tf32(b), **kw))
        patch(torch, "baddbmm", lambda s, a, b, **kw: baddbmm(s, tf32(a), tf32(b), **kw))
        patch(torch.Tensor, "baddbmm_", lambda s, a, b, **kw: baddbmm_(s, tf32(a), tf32(b), **kw))
    if mode in ("attention", "both", "all"):                                 # the explicit attention (scores, then P·V)
        einsum = torch.einsum
        patch(torch, "einsum", lambda eq, *ops: einsum(eq, *(tf32(o) for o in ops)))
    if mode in ("experts", "all"):                                           # an engine's fused-MoE GEMMs: both inputs
        import torch.nn.functional as F
        from solar_open2.moe import SolarMLP
        patch(SolarMLP, "forward", lambda self, x: self.down_proj(tf32(F.silu(self.gate_proj(tf32(x))) * self.up_proj(tf32(x)))))
    if mode in ("router", "all"):                                            # a Triton router's logits
        from solar_open2.moe import SolarRouter
        patch(SolarRouter, "scores", lambda self, x: torch.sigmoid(tf32(x.float()) @ tf32(self.weight.float()).T))
    try: yield
    finally:
        for (obj, name), fn in saved.items(): setattr(obj, name, fn)


def compare(lp_exact, lp_emul, tokens: list) -> dict:
    "As `parity.compare_lp` with the emulated run in vLLM's place: chosen-token and top-k |dlogprob|, the worst entry."
    from benchmarks.engine.parity import compare_lp
    topk = [{int(j): float(lp_emul[i, j]) for j in lp_emul[i].topk(TOPK).indices} for i in range(len(tokens))]
    c = compare_lp(lp_exact, tokens, [float(lp_emul[i, t]) for i, t in enumerate(tokens)], 0.05, topk)
    return {k: c[k] for k in ("mismatches", "max_abs_dlogprob", "topk_max_abs_dlogprob", "topk_mean_abs_dlogprob", "topk_worst")}


def run(lengths: list, tokens: int, modes: list) -> dict:
    import tempfile, torch
    from solar_open2.checkpoint import make_tiny
    from benchmarks.engine.parity import load_reference, long_prompts
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        m = load_reference(make_tiny(Path(d) / "bf16", format="bf16", weights="trained"), "cpu", "float32")
        out = {}
        for n, prompt in zip(lengths, long_prompts("trained", tuple(lengths))):
            t0 = time.time()
            with torch.no_grad():                                                # the exact run's greedy continuation
                gen = m.generate(prompt, max_new_tokens=tokens, eos_token_ids=[])[0].tokens
            ids = list(prompt) + gen
            sl = slice(len(prompt) - 1, len(ids) - 1)                            # the positions that predicted `gen`
            lp = {mode: reference_logprobs_mode(m, ids, mode)[sl] for mode in ["exact"] + modes}
            out[str(n)] = {"seconds": round(time.time() - t0, 1),
                           **{mode: compare(lp["exact"], lp[mode], gen) for mode in modes}}
            print(n, json.dumps(out[str(n)]), flush=True)
        return out


def reference_logprobs_mode(m, ids: list, mode: str):
    """The reference's log-probs [T, V] with `tf32_dots(mode)`; the attention modes (and `explicit`, their exact twin)
    run chapter attention's explicit form, whose two products are einsums, instead of SDPA."""
    from benchmarks.engine.parity import reference_logprobs
    from solar_open2.attention import GatedAttention
    explicit = mode in ("attention", "both", "all", "explicit")
    att = [x for x in m.modules() if isinstance(x, GatedAttention)]
    old = [x.impl for x in att]
    for x in att: x.impl = "reference" if explicit else x.impl
    try:
        with tf32_dots("exact" if mode == "explicit" else mode): return reference_logprobs(m, ids, "cpu")
    finally:
        for x, i in zip(att, old): x.impl = i


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[700, 4096])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES),
                    help="explicit: the exact explicit attention (a control); all: kda, attention, experts and router")
    ap.add_argument("--out", default=str(INCOMING))
    a = ap.parse_args(argv)
    import torch
    t = time.time()
    res = run(a.lengths, a.tokens, a.modes)
    rep = {"command": command_line(), "git_commit": git_commit(ROOT), "git_dirty": git_dirty(ROOT), "source_sha256": source_digest(ROOT),
           "versions": {"torch": torch.__version__, "python": platform.python_version()}, "device": "cpu",
           "rounding": "operands to TF32 (10 mantissa bits, round to nearest, ties away), fp32 accumulation",
           "topk": TOPK, "tokens": a.tokens, "lengths": res, "wall_s": round(time.time() - t, 1)}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "tail_tf32_cpu.json").write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
