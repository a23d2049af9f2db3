#!/usr/bin/env python
"""CPU dequantize throughput of the NVFP4 codec (`solar_open2.nvfp4.dequantize`) on the real expert shapes.

    python -m benchmarks.kernels.nvfp4_dequant [--repeats 7] [--threads N] [--out benchmarks/results/incoming/nvfp4_dequant.json]

For each routed-expert matrix shape of Solar-Open2 (gate/up [1280, 4096], down [4096, 1280]) it times:
- `dequantize` (256-entry byte table, the exported path) to BF16 and to fp32;
- the readable reference form (unpack nibbles, index the 16-value table) to fp32;
- a plain copy of a BF16 tensor of the output's size (the memory-bound floor on this machine).

Reported per case: median seconds, GB/s of packed input (codes + FP8 block scales), GB/s of output, and ratios
(exported vs reference, exported vs copy). Results are data: JSON (+ a PNG plot when matplotlib is available).
Timings on a shared CPU are noisy; read the ratios.
"""
import argparse, json, os, platform, statistics, sys, time
from pathlib import Path

import torch

from benchmarks.common import INCOMING, command_line, json_writer
from solar_open2.nvfp4 import _dequantize_reference, dequantize, quantize

GATE_RULE = "the exported dequantize equals the readable reference bit for bit on every shape before it is timed"

def gate(res:dict)->bool:
    "The sanity gate: one exact check per shape, all equal."
    return len(res["checks"]) == len(SHAPES) and all(c["equal"] for c in res["checks"])

SHAPES = {"gate_up_proj [1280, 4096]": (1280, 4096), "down_proj [4096, 1280]": (4096, 1280)}


def _time(fn, repeats):
    fn()                                            # warm-up
    ts = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def run(repeats: int) -> dict:
    rows, checks = [], []
    for label, (o, i) in SHAPES.items():
        q = quantize(torch.randn(o, i, generator=torch.Generator().manual_seed(0)) * 0.02)
        in_bytes = q.packed.numel() + q.scale.numel()                 # uint8 codes + FP8 scales
        checks.append({"shape": label, "equal": torch.equal(dequantize(q.packed, q.scale, q.global_scale, torch.float32),
                                                            _dequantize_reference(q.packed, q.scale, q.global_scale))})
        ref_out = torch.empty(o, i, dtype=torch.bfloat16)
        cases = {
            "dequantize->bf16": (lambda: dequantize(q.packed, q.scale, q.global_scale, torch.bfloat16), 2),
            "dequantize->fp32": (lambda: dequantize(q.packed, q.scale, q.global_scale, torch.float32), 4),
            "reference->fp32": (lambda: _dequantize_reference(q.packed, q.scale, q.global_scale), 4),
            "copy bf16 (floor)": (lambda: ref_out.clone(), 2),
        }
        t = {k: _time(f, repeats) for k, (f, _) in cases.items()}
        for k, (_, osz) in cases.items():
            rows.append({"shape": label, "case": k, "seconds": t[k],
                         "packed_GBps": in_bytes / t[k] / 1e9, "output_GBps": o * i * osz / t[k] / 1e9})
        rows.append({"shape": label, "case": "ratios",
                     "exported_vs_reference_fp32": t["reference->fp32"] / t["dequantize->fp32"],
                     "bf16_dequant_time_vs_copy": t["dequantize->bf16"] / t["copy bf16 (floor)"]})
    return {"checks": checks, "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--out", default=str(INCOMING / "nvfp4_dequant.json"))
    a = ap.parse_args(argv)
    if a.threads: torch.set_num_threads(a.threads)
    res = run(a.repeats)
    res.update({
        "command": command_line(None if argv is None else [sys.argv[0], *argv]),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "machine": {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(),
                    "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "note": "median of repeats; packed_GBps counts uint8 codes + FP8 block scales read",
    })
    out = Path(a.out)
    json_writer(res, [out], gate, GATE_RULE, ("rows",))()
    for r in res["rows"]:
        if r["case"] == "ratios":
            print(f"  {r['shape']}: exported/reference speedup x{r['exported_vs_reference_fp32']:.2f}, "
                  f"bf16 dequant = {r['bf16_dequant_time_vs_copy']:.1f} x the time of a bf16 copy")
        else:
            print(f"{r['shape']:26s} {r['case']:18s} {r['seconds']*1e3:8.2f} ms  {r['packed_GBps']:6.3f} GB/s packed  {r['output_GBps']:6.3f} GB/s out")
    try:
        import matplotlib; matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = [r for r in res["rows"] if r["case"] != "ratios"]
        fig, ax = plt.subplots(figsize=(8, 3.5))
        labels = [f"{r['shape'].split()[0]}\n{r['case']}" for r in rows]
        ax.barh(range(len(rows)), [r["packed_GBps"] for r in rows])
        ax.set_yticks(range(len(rows)), labels, fontsize=7); ax.set_xlabel("GB/s of packed input (codes + scales)")
        ax.set_title(f"NVFP4 dequantize on CPU ({res['machine']['torch_threads']} threads)")
        fig.tight_layout(); fig.savefig(out.with_suffix(".png"), dpi=110)
    except ImportError:
        pass
    print(f"wrote {out}")
    return 0 if gate(res) else 1


if __name__ == "__main__":
    sys.exit(main())
