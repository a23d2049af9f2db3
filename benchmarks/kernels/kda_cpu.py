#!/usr/bin/env python
"""CPU timing of the two KDA core functions: `kda_chunked` against the reference loop `kda_recurrent`.

    python -m benchmarks.kernels.kda_cpu [--T 4096] [--H 4] [--D 128] [--threads 1] [--repeats 27] [--recurrent-repeats 9] [--out PATH]

Both run fp32 on the same random inputs (unit-norm q/k, decay from the KDA gate, beta = 2*sigmoid, a random initial
state). The two are timed interleaved (the chunked form `--repeats` times, the loop `--recurrent-repeats` times, spread
evenly among them); the headline is the ratio of the MEDIAN CPU times (the best times and wall times are recorded too).
Writes a JSON record (command, versions, CPU, thread count, load average, times, speed-ups, agreement) to
`benchmarks/results/incoming/kda_cpu.json` and prints one line. The figure is a ratio on a shared CPU: read it with the
recorded load average and the spread of the runs.
"""
import argparse, json, math, os, platform, statistics, sys, time
from pathlib import Path

import torch

from benchmarks.common import INCOMING, command_line, json_writer
from solar_open2.kda import kda_chunked, kda_recurrent, random_kda_inputs, rel_rms

GATE_RULE = "the two timed functions agree: relative RMS of the outputs and of the final states below 1e-5 (fp32)"
FIGURES = ("speedup", "speedup_best", "speedup_wall")

def gate(res:dict)->bool:
    "The sanity gate: the chunked form computed what the loop computed, so the ratio compares two versions of one thing."
    return res["rel_rms_o"] < 1e-5 and res["rel_rms_state"] < 1e-5


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"): return line.split(":", 1)[1].strip()
    except OSError: pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=4096, help="sequence length")
    ap.add_argument("--H", type=int, default=4, help="heads")
    ap.add_argument("--D", type=int, default=128, help="head dim (d_k = d_v)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a fair, reproducible ratio)")
    ap.add_argument("--repeats", type=int, default=27, help="timed runs of the chunked form (the median is reported)")
    ap.add_argument("--recurrent-repeats", type=int, default=9, help="timed runs of the loop (the median is reported)")
    ap.add_argument("--out", default=str(INCOMING / "kda_cpu.json"))
    a = ap.parse_args(argv)
    if min(a.T, a.H, a.D, a.threads, a.repeats, a.recurrent_repeats) < 1: ap.error("all sizes must be positive")
    torch.set_num_threads(a.threads)
    x = random_kda_inputs(B=1, T=a.T, H=a.H, K=a.D, seed=0, initial_state=True)
    load0 = os.getloadavg()

    kda_chunked(**{n: (t[:, :128] if n != "initial_state" else t) for n, t in x.items()})   # warm-up
    def timed(fn):                      # (result, CPU seconds of this process, wall seconds)
        c0, w0 = time.process_time(), time.perf_counter()
        r = fn(**x, output_final_state=True)
        return r, time.process_time() - c0, time.perf_counter() - w0
    chunked_cpu, chunked_wall, recurrent_cpu, recurrent_wall = [], [], [], []
    every = max(1, math.ceil(a.repeats / a.recurrent_repeats))
    for i in range(max(a.repeats, a.recurrent_repeats * every)):   # interleaved, so both see the same background load
        if i < a.repeats:
            (o_c, s_c), c, w = timed(kda_chunked); chunked_cpu.append(c); chunked_wall.append(w)
        if i % every == 0 and len(recurrent_cpu) < a.recurrent_repeats:
            (o_r, s_r), c, w = timed(kda_recurrent); recurrent_cpu.append(c); recurrent_wall.append(w)
    # CPU time, not wall time: on a shared machine wall time also counts the seconds other processes held the core
    med = statistics.median
    recurrent_s, chunked_s = med(recurrent_cpu), med(chunked_cpu)

    rec = dict(
        benchmark="kda_cpu", command=command_line(None if argv is None else [sys.argv[0], *argv]),
        T=a.T, H=a.H, D=a.D, B=1, dtype="float32", chunk_size=64, threads=a.threads,
        timing="median CPU time of the process (time.process_time) over the runs; best times and wall times recorded alongside",
        recurrent_s=recurrent_s, chunked_s=chunked_s, speedup=recurrent_s / chunked_s,
        recurrent_best_s=min(recurrent_cpu), chunked_best_s=min(chunked_cpu),
        speedup_best=min(recurrent_cpu) / min(chunked_cpu),
        recurrent_cpu_runs_s=recurrent_cpu, chunked_cpu_runs_s=chunked_cpu,
        recurrent_wall_runs_s=recurrent_wall, chunked_wall_runs_s=chunked_wall,
        speedup_wall=med(recurrent_wall) / med(chunked_wall),
        rel_rms_o=rel_rms(o_c, o_r), rel_rms_state=rel_rms(s_c, s_r),
        cpu=cpu_model(), cpu_count=os.cpu_count(), loadavg_before=load0, loadavg_after=os.getloadavg(),
        torch=torch.__version__, python=platform.python_version(),
        time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    out = Path(a.out)
    json_writer(rec, [out], gate, GATE_RULE, FIGURES)()
    print(f"T={a.T} H={a.H} D={a.D} threads={a.threads}: median CPU time recurrent {recurrent_s:.2f} s, chunked {chunked_s:.3f} s "
          f"-> {rec['speedup']:.1f}x (best runs {rec['speedup_best']:.1f}x, wall {rec['speedup_wall']:.1f}x; "
          f"rel. RMS o {rec['rel_rms_o']:.1e}, state {rec['rel_rms_state']:.1e}); "
          f"load {load0[0]:.1f} -> {rec['loadavg_after'][0]:.1f}; wrote {out}")
    return 0 if gate(rec) else 1


if __name__ == "__main__":
    sys.exit(main())
