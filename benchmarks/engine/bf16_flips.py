"""The reference model's own bf16 against its fp32, on the tiny checkpoints: how many greedy tokens bf16 rounding
flips, and how close to a tie each flip is. The prior for the GPU parity run (`benchmarks.engine.parity`), whose
bf16 engine is judged against the fp32 reference on the same prompts.

    python -m benchmarks.engine.bf16_flips [--weights trained|random|FILE] [--tokens 64] [--device cpu] [--tie-nats 0.05]

For each format (Nota's NVFP4 compressed-tensors and the BF16 twin) and each of parity's five prompts
(`prompts_for(weights)`), the fp32 reference generates `--tokens` greedy tokens; the bf16 reference is then
teacher-forced on that sequence, and every position where its argmax differs from the fp32 token is a flip, reported
with the fp32 top-2 margin there (nats). Gate: every flip is a near-tie (margin < --tie-nats), the parity run's own
rule for a divergence. Writes `bf16_flips.json` to `benchmarks/results/incoming/` (and `$OUT`).
"""
import argparse, sys

from benchmarks.common import INCOMING, ROOT, json_writer, out_dir_default, result_head

GATE_RULE = "every position where the bf16 reference's argmax differs from the fp32 greedy token is an fp32 near-tie (top-2 margin < tie_nats)"
FIGURES = ("flips", "positions")


def gate(res:dict)->bool:
    return res["positions"] > 0 and all(m < res["tie_nats"] for c in res["cases"].values() for m in c["fp32_margin_at_flips"])


def flips(m32, m16, prompt:list, tokens:int, device:str)->dict:
    "One prompt: fp32 greedy tokens, and where the bf16 model (teacher-forced on them) picks another, with the fp32 margins."
    import torch
    g = list(m32.generate([prompt], max_new_tokens=tokens, eos_token_ids=[])[0].tokens)
    seq = torch.tensor([prompt + g], device=device)                      # [1, P + N]
    l32 = m32(seq)[0][0, len(prompt) - 1:-1].float()                     # [N, V]: the logits that chose each new token
    l16 = m16(seq)[0][0, len(prompt) - 1:-1].float()                     # [N, V]
    top2 = l32.log_softmax(-1).topk(2, -1).values                        # [N, 2]
    margin = top2[:, 0] - top2[:, 1]                                     # [N]
    at = (l16.argmax(-1) != torch.tensor(g, device=device)).nonzero().flatten().tolist()
    return {"prompt_tokens": len(prompt), "new_tokens": len(g), "flips_at": at,
            "fp32_margin_at_flips": [round(margin[i].item(), 4) for i in at], "min_fp32_margin": round(margin.min().item(), 4)}


def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="trained", metavar="{trained,random,FILE}")
    ap.add_argument("--tokens", type=int, default=64); ap.add_argument("--device", default="cpu")
    ap.add_argument("--tie-nats", type=float, default=0.05)
    ap.add_argument("--formats", default="compressed-tensors,bf16")
    ap.add_argument("--prompts", type=int, default=5, help="the first N of parity's prompts")
    ap.add_argument("--out", default=out_dir_default())
    a = ap.parse_args(argv)
    import torch
    from solar_open2.checkpoint import tiny_checkpoint
    from benchmarks.engine.parity import load_reference, prompts_for
    torch.set_grad_enabled(False)
    res = {**result_head("bf16_flips", a.device, ROOT), "weights": a.weights, "tokens": a.tokens, "tie_nats": a.tie_nats, "cases": {}}
    paths = [INCOMING / "bf16_flips.json"] + ([f"{a.out}/bf16_flips.json"] if a.out else [])
    ps = prompts_for(a.weights)[:a.prompts]
    for fmt in a.formats.split(","):
        ck = tiny_checkpoint(fmt, weights=a.weights)
        m32, m16 = load_reference(ck, a.device, "float32"), load_reference(ck, a.device, "bfloat16")
        for i, p in enumerate(ps):
            res["cases"][f"{fmt}:{i}"] = c = flips(m32, m16, p, a.tokens, a.device)
            print(f"{fmt} prompt {i} ({c['prompt_tokens']} tokens): flips at {c['flips_at']} (fp32 margins {c['fp32_margin_at_flips']})", flush=True)
    res["positions"] = sum(c["new_tokens"] for c in res["cases"].values())
    res["flips"] = sum(len(c["flips_at"]) for c in res["cases"].values())
    json_writer(res, paths, gate, GATE_RULE, FIGURES)()
    print(f"{res['flips']} flips in {res['positions']} greedy positions; gate {gate(res)}")
    return 0 if gate(res) else 1


if __name__ == "__main__": sys.exit(main())
