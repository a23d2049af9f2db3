"""The figures of one engine run: decode and batch rates from token arrival times, the output-diversity check every
figure is gated on, and the ceilings each figure is set against (the budget chapter's decode roofline, a prefill
compute ceiling, the bytes-per-token time model of one decode step)."""
from __future__ import annotations
import statistics

from solar_open2 import budget
from solar_open2.config import SolarOpen2Config

H200_BANDWIDTH = budget.BANDWIDTH["h200"]            # 4.8e12 B/s per GPU
H200_BF16_FLOPS = 989.4e12                           # dense BF16 tensor-core peak, H200 SXM (the H100 SXM's too)

def gpu_peaks(gpu:str|None)->tuple:
    """(bandwidth B/s, dense BF16 FLOP/s, key) of the GPU named `gpu` (nvidia-smi's name): the budget's table of GPUs,
    the H200's figures when the name is not in it (key None then), and the BF16 peak of the prefill ceiling, the same
    on the H100 and H200 SXM. Every ceiling a run reports is set against the GPU it ran on."""
    g = next((k for k, g in budget.GPUS.items() if gpu and g.name in gpu), None)
    return budget.GPUS[g or "h200"].bandwidth, H200_BF16_FLOPS, g

# --------------------------------------------------------------------------------------------------------------
# figures from token arrival times
# --------------------------------------------------------------------------------------------------------------

def single_stream_stats(rec:dict)->dict:
    """Prefill (time to first token) and decode rate of one request: rate = (n-1) / (t_last - t_first). The gaps are
    between engine steps: tokens that arrive together (a speculative step's accepted tokens) are one step, and
    `tokens_per_step` says how many a step yielded on average (1 without speculation)."""
    t, n = rec["times"], len(rec["times"])
    if n == 0: raise ValueError("request produced no token")
    ttft = t[0] - rec["t_add"]
    out = {"prompt_len": rec["prompt_len"], "tokens": n, "ttft_s": ttft, "prefill_tok_s": rec["prompt_len"] / ttft}
    steps = [x for i, x in enumerate(t) if i == 0 or x != t[i - 1]]      # one arrival time per engine step
    if n >= 3 and len(steps) >= 3:
        gaps = [b - a for a, b in zip(steps[:-1], steps[1:])]
        med = statistics.median(gaps)
        per_step = (n - 1) / (len(steps) - 1)
        top = sorted(range(len(gaps)), key=lambda i: -gaps[i])[:5]
        out.update(decode_s=t[-1] - t[0], decode_tok_s=(n - 1) / (t[-1] - t[0]), steps=len(steps) - 1,
                   tokens_per_step=per_step,
                   itl_median_ms=1e3 * med, itl_p90_ms=1e3 * sorted(gaps)[int(0.9 * (len(gaps) - 1))],
                   itl_max_ms=1e3 * max(gaps),
                   stall_s=sum(g - med for g in gaps if g > 2 * med),      # time in gaps over twice the median
                   median_tok_s=per_step / med,                             # the rate without the stalls
                   itl_top=[[i, round(1e3 * gaps[i], 3)] for i in top])    # [gap index, ms]: where the window lost time
    return out

def batch_stats(recs:list)->dict:
    "Aggregate decode throughput over the window in which every sequence decodes (last first token .. first finish)."
    if not recs or any(len(r["times"]) < 2 for r in recs): raise ValueError("every request must produce >= 2 tokens")
    start = max(r["times"][0] for r in recs)
    end = min(r["times"][-1] for r in recs)
    n_window = sum(sum(1 for x in r["times"] if start < x <= end) for r in recs)
    first_add = min(r["t_add"] for r in recs)
    last = max(r["times"][-1] for r in recs)
    total = sum(len(r["times"]) for r in recs)
    out = {"batch": len(recs), "prompt_len": recs[0]["prompt_len"], "tokens_per_seq": len(recs[0]["times"]),
           "window_s": end - start, "window_tokens": n_window, "e2e_s": last - first_add, "e2e_out_tok_s": total / (last - first_add),
           "ttft_max_s": start - first_add}
    if end > start and n_window >= len(recs):
        out.update(decode_tok_s=n_window / (end - start), window="all-decoding")
    else:                                    # degenerate window (very short runs): every token after each first
        span = last - start
        out.update(decode_tok_s=(total - len(recs)) / span if span > 0 else float("nan"), window="fallback")
    out["per_seq_tok_s"] = out["decode_tok_s"] / len(recs)
    return out

def output_sanity(recs:list)->dict:
    """The output-diversity check of a decode figure. Dummy weights can produce NaN logits, and then argmax repeats one
    id; MoE routing may then collapse onto a few experts, which reads fewer bytes than real traffic and flatters the
    figure. Verdict: `passed` False when every request repeated one token id, None when no request made more than 4
    tokens (too few to tell)."""
    distinct = [len(set(r["tokens"])) for r in recs if r["tokens"]]
    checkable = bool(distinct) and max(len(r["tokens"]) for r in recs) > 4
    degenerate = checkable and max(distinct) <= 1
    return {"check": "distinct token ids per request", "distinct_ids_min": min(distinct, default=0),
            "distinct_ids_max": max(distinct, default=0), "degenerate": degenerate,
            "passed": (not degenerate) if checkable else None,
            "note": ("every request repeated one token id: the logits are probably NaN/constant, and MoE routing may be "
                     "degenerate too (all tokens to the same experts), which flatters batch figures") if degenerate else
                    "" if checkable else "too few tokens per request to check"}

def first_token_sanity(recs:list)->dict:
    """The output-diversity check of a prefill figure, whose requests make one token each: across requests (other
    prompts), the first tokens must not all be one id. None with fewer than two requests (nothing to compare)."""
    firsts = [r["tokens"][0] for r in recs if r["tokens"]]
    checkable = len(firsts) >= 2
    degenerate = checkable and len(set(firsts)) == 1
    return {"check": "distinct first tokens across requests", "requests": len(firsts), "distinct_first_ids": len(set(firsts)),
            "degenerate": degenerate, "passed": (not degenerate) if checkable else None,
            "note": ("every prompt gave the same first token: the logits are probably NaN/constant") if degenerate else
                    "" if checkable else "one request: nothing to compare its first token with"}

def sanity_passed(s:dict|None)->bool|None:
    "The verdict of one sanity record: True, False, or None (unchecked; also for a record written before `passed`)."
    if not s: return None
    if "passed" in s: return s["passed"]
    return None if s.get("degenerate") is None else not s["degenerate"]

# --------------------------------------------------------------------------------------------------------------
# rooflines
# --------------------------------------------------------------------------------------------------------------

def decode_roofline(cfg:SolarOpen2Config, tp:int, context:float, batch:int=1, bandwidth:float=H200_BANDWIDTH)->dict:
    "The budget chapter's decode ceiling: bytes one rank reads per step at `context`, `batch`; tok/s per sequence and in all."
    ctx = int(round(context))
    per_seq = budget.decode_ceiling(bandwidth, cfg, tp, ctx, batch=batch)
    return {"context": ctx, "batch": batch, "bytes_per_step_per_rank": budget.decode_bytes(cfg, tp, ctx, batch=batch),
            "per_seq_tok_s": per_seq, "aggregate_tok_s": per_seq * batch, "bandwidth_Bps": bandwidth}

def spec_roofline(cfg:SolarOpen2Config, tp:int, context:float, k:int, mal:float|None=None,
                  bandwidth:float=H200_BANDWIDTH)->dict:
    """The ceiling of speculative decode with k drafts a step: the budget chapter's bytes of one verify of 1 + k tokens
    (`budget.verify_bytes`: the routed experts of all the tokens, a state stored per token), their ratio to one token's
    (`floor_ratio`: no verify step can cost less, relative to a plain step at the same fraction of its roofline), and,
    given the mean accepted length `mal` (tokens a step), the tok/s ceiling `mal` x bandwidth / bytes."""
    ctx = int(round(context))
    vb, one = budget.verify_bytes(cfg, tp, ctx, 1 + k), budget.decode_bytes(cfg, tp, ctx)
    return {"context": ctx, "tokens": 1 + k, "bytes_per_step_per_rank": vb, "floor_ratio": vb / one,
            "step_us": vb / bandwidth * 1e6, "mean_accepted_length": mal,
            "per_seq_tok_s": mal * bandwidth / vb if mal else None, "bandwidth_Bps": bandwidth}

def prefill_flops_per_token(cfg:SolarOpen2Config, tp:int, context:int)->float:
    """FLOPs per prompt token per rank: 2 x active weights (lm_head only on the last token: left out), causal
    attention over an average context/2 in the GQA layers, and the KDA chunk algorithm (chunk 64) in the KDA layers."""
    return sum(prefill_flops_by_family(cfg, tp, context).values())

def prefill_flops_by_family(cfg:SolarOpen2Config, tp:int, context:int)->dict:
    """`prefill_flops_per_token` by the profile's kernel families (`trace.KERNEL_FAMILIES`): the routed experts (`moe`),
    every other weight (`dense_gemm`: projections, shared expert, router; norms are a rounding error), the GQA layers'
    attention over context/2 (`attention`) and the KDA chunk algorithm (`kda`); `prefill_flops_per_token` is their sum."""
    c = cfg.count_params(by_group=True)
    moe = 2 * c["routed_expert"] * cfg.num_experts_per_tok // cfg.n_routed_experts
    dense = 2 * (cfg.active_params() - cfg.vocab_size * cfg.hidden_size)
    attn = len(cfg.full_attention_layers) * 2 * 2 * cfg.num_attention_heads * cfg.head_dim * context / 2
    H, D = cfg.kda_num_heads, cfg.kda_head_dim
    kda = len(cfg.kda_layers) * H * (2 * 2 * 64 * D + 6 * D * D)
    return {"moe": moe / tp, "dense_gemm": (dense - moe) / tp, "attention": attn / tp, "kda": kda / tp}

def prefill_roofline(cfg:SolarOpen2Config, tp:int, context:int, flops:float=H200_BF16_FLOPS)->dict:
    "Compute ceiling of prefill (this script's estimate; the budget chapter models decode only)."
    f = prefill_flops_per_token(cfg, tp, context)
    return {"context": context, "flops_per_token_per_rank": f, "tok_s": flops / f, "peak_flops": flops}

def with_roofline(fig:dict, roof:dict, value_key:str, ceiling_key:str, kind:str)->dict:
    "Attach `fraction_of_roofline` = fig[value_key] / roof[ceiling_key]."
    fig = dict(fig)
    fig.update(value_tok_s=fig[value_key], roofline_tok_s=roof[ceiling_key], roofline_kind=kind, roofline=roof,
               fraction_of_roofline=fig[value_key] / roof[ceiling_key])
    return fig

def n_allreduces(cfg:SolarOpen2Config, tp:int)->int:
    "All-reduces per forward step at TP>1: after each mixer and each MoE (2 per layer) and after the vocab-parallel embedding."
    return 0 if tp == 1 else 2 * cfg.num_hidden_layers + 1

def predicted_step_us(cfg:SolarOpen2Config, tp:int, context:int, batch:int=1, bandwidth:float=H200_BANDWIDTH,
                      allreduce_us:float=38.0)->dict:
    "The bytes-per-token model as time per decode step per kernel family: bytes / bandwidth, all-reduce as latency."
    p = budget.decode_bytes(cfg, tp, context, batch=batch, by_part=True)
    fam = {"dense_gemm": p["gqa_proj"] + p["kda_proj"] + p["shared_expert"] + p["lm_head"] + p["router"],
           "moe": p["routed_experts"], "kda": p["kda_state"], "attention": p["kv_read"] + p["kv_write"],
           "norm_act": p["norms"] + p["embed_row"]}
    us = {k: 1e6 * v / bandwidth for k, v in fam.items()}
    us["allreduce"] = n_allreduces(cfg, tp) * allreduce_us
    us["total"] = sum(us.values())
    return us
