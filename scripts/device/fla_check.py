#!/usr/bin/env python
"""On the GPU machine, before training with `--kda-kernel fla`: FLA's `chunk_kda` (through `fla_kda_core`) against the
torch core `kda_chunked_autograd` at the tiny layer's shapes (2 x 300 tokens, 4 heads of 128, strong decays, an initial
state): outputs, final state and every input gradient, relative RMS, bound 5e-3 (chapter 06a_train measures it). The
same comparison as the chapter's `#| gpu` cell, without running the chapter's CPU cells; prints one JSON line, exit 1
when over the bound.      python scripts/device/fla_check.py"""
import json, sys, time
import torch
from solar_open2.kda import kda_chunked_autograd, l2norm, random_kda_inputs, rel_rms
from solar_open2.train import fla_kda_core


def core_run(fn, x):
    "A core's outputs, final state and input gradients (a fixed, non-uniform weighting of the outputs as the loss)."
    xs = {n: t.clone().requires_grad_() for n, t in x.items()}
    with torch.enable_grad():
        o, s = fn(**xs, scale=128 ** -0.5, output_final_state=True)
        ((o * torch.linspace(-1, 1, o.shape[-1], device=o.device)).sum() + s.square().sum()).backward()
    return [o.detach(), s.detach()] + [t.grad for t in xs.values()]


def main()->int:
    torch.backends.cuda.matmul.allow_tf32 = False
    x = random_kda_inputs(B=2, T=300, H=4, K=128, seed=9, initial_state=True)
    x["g"] = x["g"] * 4                                                    # strong decays too
    x = {n: t.cuda() for n, t in x.items()}
    x["q"], x["k"] = l2norm(x["q"]), l2norm(x["k"])                        # as the layer hands them over
    t0 = time.perf_counter(); got = core_run(fla_kda_core, x); first_s = time.perf_counter() - t0   # autotuning included
    ref = core_run(kda_chunked_autograd, x)
    err = dict(zip(["o", "state"] + [f"d{n}" for n in x], (rel_rms(a, b) for a, b in zip(got, ref))))
    ok = max(err.values()) < 5e-3
    print(json.dumps({"fla_vs_torch_rel_rms": {n: float(f"{e:.2e}") for n, e in err.items()}, "bound": 5e-3, "ok": ok,
                      "first_call_s": round(first_s, 1), "gpu": torch.cuda.get_device_name()}))
    return 0 if ok else 1


if __name__ == "__main__": sys.exit(main())
