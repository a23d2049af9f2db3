#!/usr/bin/env python
"""On the GPU machine, before training with `--kda-kernel fla`: chapter 06a_train's comparison of FLA's core with the
torch core (`train.fla_agreement`: outputs, final state and every input gradient at the tiny layer's shapes, relative
RMS, bound `train.FLA_BOUND`), without running the chapter's CPU cells; the first call's time includes FLA's
compilation and autotuning. Prints one JSON line, exit 1 when over the bound.      python scripts/device/fla_check.py"""
import json, sys, time
import torch
from solar_open2.train import FLA_BOUND, fla_agreement


def main()->int:
    t0 = time.perf_counter(); err = fla_agreement("cuda"); first_s = time.perf_counter() - t0
    ok = max(err.values()) < FLA_BOUND
    print(json.dumps({"fla_vs_torch_rel_rms": {n: float(f"{e:.2e}") for n, e in err.items()}, "bound": FLA_BOUND, "ok": ok,
                      "first_call_s": round(first_s, 1), "gpu": torch.cuda.get_device_name()}))
    return 0 if ok else 1


if __name__ == "__main__": sys.exit(main())
