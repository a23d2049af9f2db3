"""The reference model's own bf16 against its fp32, on the tiny checkpoints: how many greedy tokens bf16 rounding
flips, and how close to a tie each flip is. The prior for the GPU parity run (`benchmarks.engine.parity`), whose
bf16 engine is judged against the fp32 reference on the same prompts.

    python -m benchmarks.engine.bf16_flips [--weights trained|random|FILE] [--tokens 64] [--device cpu] [--tie-nats 0.05]

For each format (Nota's NVFP4 compressed-tensors and the BF16 twin) and each of parity's five prompts
(`prompts_for(weights)`), the fp32 reference generates `--tokens` greedy tokens; the bf16 reference is then
teacher-forced on that sequence, and its argmax at every position is judged as the parity run judges an engine's token
(`parity.compare_lp`): a pick other than the fp32 argmax is a near-tie when it is within --tie-nats of it, else a
mismatch; each flip is reported with that gap (nats). Gate: no mismatch, the parity run's own rule. Writes `bf16_flips.json` to `benchmarks/results/incoming/` (and `$OUT`).
"""
import argparse, sys

from benchmarks.common import INCOMING, ROOT, json_writer, out_dir_default, result_head

GATE_RULE = ("every position where the bf16 reference's argmax differs from the fp32 greedy token is a near-tie: within "
             "tie_nats of the fp32 argmax (parity.compare_lp's rule)")
FIGURES = ("flips", "positions")


def gate(res:dict)->bool:
    return res["positions"] > 0 and not any(c["mismatches"] for c in res["cases"].values())


def flips(m32, m16, prompt:list, tokens:int, device:str, tie_nats:float)->dict:
    "One prompt: the fp32 greedy tokens, and the bf16 model's picks on them (teacher-forced) judged by `compare_lp`."
    from benchmarks.engine.parity import compare_lp, reference_logprobs
    g = list(m32.generate([prompt], max_new_tokens=tokens, eos_token_ids=[])[0].tokens)
    ids, n, at = prompt + g, len(g), len(prompt) - 1
    lp32 = reference_logprobs(m32, ids, device)[at:at + n]                # [n, V]: the log-probs that chose each new token
    lp16 = reference_logprobs(m16, ids, device)[at:at + n]                # [n, V]
    pick = lp16.argmax(-1)                                               # [n] the bf16 model's greedy choice
    c = compare_lp(lp32, pick.tolist(), lp16.gather(1, pick[:, None])[:, 0].tolist(), tie_nats)
    flip = sorted(c["mismatches"] + c["near_ties"])
    gap = lp32.max(-1).values - lp32.gather(1, pick[:, None])[:, 0]       # [n] how far below the fp32 argmax bf16 picked
    return {"prompt_tokens": len(prompt), "new_tokens": n, "flips_at": flip, "near_ties": c["near_ties"],
            "mismatches": c["mismatches"], "fp32_gap_at_flips": [round(gap[i].item(), 4) for i in flip],
            "min_fp32_top2_margin": round(c["min_top2_margin"], 4)}


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
            res["cases"][f"{fmt}:{i}"] = c = flips(m32, m16, p, a.tokens, a.device, a.tie_nats)
            print(f"{fmt} prompt {i} ({c['prompt_tokens']} tokens): flips at {c['flips_at']} (below the fp32 argmax by {c['fp32_gap_at_flips']} nats)", flush=True)
    res["positions"] = sum(c["new_tokens"] for c in res["cases"].values())
    res["flips"] = sum(len(c["flips_at"]) for c in res["cases"].values())
    json_writer(res, paths, gate, GATE_RULE, FIGURES)()
    print(f"{res['flips']} flips in {res['positions']} greedy positions; gate {gate(res)}")
    return 0 if gate(res) else 1


if __name__ == "__main__": sys.exit(main())
