#!/usr/bin/env python
"""The tiny model's training step on a GPU with each KDA training core (chapter 06a_train): `torch`
(`kda_chunked_autograd`, every pairwise decay materialised) against `fla` (FLA's `chunk_kda`, forward and backward
in Triton), side by side in one process, as `train` runs them (the step captured as one CUDA graph, the batch built
on the host each step).

    python -m benchmarks.kernels.train_step [--batch 32] [--seq 256] [--steps 150] [--kernels torch,fla,torch] [--out DIR]

Each entry of `--kernels` is one `train(...)` run from the same seeded start on the same corpus stream: the rate is
steps per second between the last two logged steps after `--skip` (capture, autotuning and warm-up excluded), and
the first entry is repeated at the end (A/B/A) so that drift on the machine shows. Sanity gate: every run's losses
finite, and the runs' losses at the first logged step and at the last agree within `--loss-rtol` (the same model on
the same data; FLA's fp32 dots are TF32, so the two drift apart slowly, not at once). Writes
`train_step.json` to `benchmarks/results/incoming/` (and `--out`, default `$OUT`).
"""
import argparse, math, statistics, sys, time

from benchmarks.common import INCOMING, json_writer, out_dir_default, result_head, ROOT

GATE_RULE = ("every run's logged losses finite, and every run's loss at the first logged step and at the last within "
             "loss_rtol of the first run's (same seed, same batches)")
FIGURES = ("steps_per_s", "speedup")


def gate(res:dict)->bool:
    runs, tol = res["runs"], res["loss_rtol"]
    if len(runs) < 2 or not all(r["finite"] for r in runs): return False
    a = runs[0]
    return all(abs(r["losses"][i] - a["losses"][i]) <= tol * abs(a["losses"][i]) for r in runs[1:] for i in (0, -1))


def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32); ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per run")
    ap.add_argument("--skip", type=int, default=50, help="steps before the timed span (capture, autotuning, warm-up)")
    ap.add_argument("--kernels", default="torch,fla,torch", help="the runs, in order (A/B/A by default)")
    ap.add_argument("--kda-chunk", type=int, default=8, help="the torch core's chunk")
    ap.add_argument("--loss-rtol", type=float, default=0.02)
    ap.add_argument("--out", default=out_dir_default())
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available(): print("train_step: no CUDA device", file=sys.stderr); return 2
    from solar_open2.train import KDA_KERNELS, train
    kernels = a.kernels.split(",")
    if any(k not in KDA_KERNELS for k in kernels): ap.error(f"--kernels: each one of {KDA_KERNELS}, got {a.kernels!r}")
    if not 0 < a.skip < a.steps: ap.error("--skip must be between 0 and --steps")
    res = {**result_head("train_step", "cuda", ROOT), "batch": a.batch, "seq": a.seq, "steps": a.steps, "skip": a.skip,
           "kda_chunk": a.kda_chunk, "loss_rtol": a.loss_rtol, "runs": []}
    try:
        import fla; res["versions"]["fla"] = getattr(fla, "__version__", "?")
    except ImportError: pass
    paths = [INCOMING / "train_step.json"] + ([f"{a.out}/train_step.json"] if a.out else [])
    save = json_writer(res, paths, gate, GATE_RULE, FIGURES)
    for k in kernels:
        t0 = time.perf_counter()
        _, hist = train(steps=a.steps, batch=a.batch, seq=a.seq, warmup=20, device="cuda", kda_chunk=a.kda_chunk,
                        kda_kernel=k, log_every=a.skip, log=lambda s: None)
        s0, s1 = hist[0], hist[-1]                                          # at step `skip` and at the last step
        rate = (s1["step"] - s0["step"]) / (s1["s"] - s0["s"])
        res["runs"].append({"kernel": k, "steps_per_s": round(rate, 3), "tokens_per_s": round(rate * a.batch * a.seq),
                            "losses": [h["loss"] for h in hist], "mode": s1["mode"], "wall_s": round(time.perf_counter() - t0, 1),
                            "finite": all(math.isfinite(h["loss"]) for h in hist)})
        print(f"{k}: {rate:.2f} steps/s ({rate * a.batch * a.seq:,.0f} tokens/s, {s1['mode']}), losses {res['runs'][-1]['losses']}")
        save()
    by = {k: statistics.median(r["steps_per_s"] for r in res["runs"] if r["kernel"] == k) for k in dict.fromkeys(kernels)}
    res["steps_per_s"] = by
    if "torch" in by and "fla" in by: res["speedup"] = round(by["fla"] / by["torch"], 2)
    save()
    print(f"steps/s by kernel (median of runs) {by}; fla/torch {res.get('speedup')}; gate {gate(res)}")
    return 0 if gate(res) else 1


if __name__ == "__main__":
    sys.exit(main())
