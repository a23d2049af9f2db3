#!/usr/bin/env python
"""Nsight Compute on the batch-1 MoE kernels at one and a few tokens (issue 28): why the decode over Marlin's layout
streams its bytes slower than the decode over the raw layout.

    python -m benchmarks.kernels.moe_profile [--tokens 1,8] [--out DIR] [--ncu PATH]      # on the GPU machine

One MoE layer's routed experts at the real per-rank shapes, as `benchmarks.kernels.moe_batch` builds them (random
NVFP4 experts with finite, positive scales; distinct experts per token; vLLM's own Marlin repack for the second
layout). For each token count, one launch of each kernel of both paths: the raw-layout decode (chapter `moe_decode`,
`moe_decode_triton` with its `TILES`) and the decode over Marlin's layout (chapter `moe_marlin`, `moe_marlin_triton`
with its `MARLIN_TILES`). The script runs itself under `ncu --set full --profile-from-start off` (the child, `--child`,
compiles and warms every kernel outside the profiled range, then profiles one call of each path per token count) and
reads the report back as raw CSV. `--paths` adds (by default) the Marlin-layout decode in packed fp16
(`MarlinTile.half2` for both kernels, not yet in `MARLIN_TILES`): its two activation launches are not profiled, its
gate/up and down are.

Gate: before anything is profiled, each path's output on the token count's tokens is within `moe_batch.CHECK_LIMIT`
relative RMS of the plain fp32 version and finite, and the report holds exactly the expected launches (two kernels a
path a token count); otherwise the launches and ratios are withheld. Per launch the JSON keeps what says where the time
goes: duration, DRAM bytes and throughput, L1 and L2 hit rates, global-load sectors per request, registers per thread,
waves and achieved occupancy, instructions executed, cycles per issued instruction and the warp stall reasons (cycles
per issued instruction, by reason); and per token count and kernel (gate_up, down) Marlin-layout over raw-layout
ratios. Writes `moe_profile.json` (and the `.ncu-rep` and raw CSV) to `benchmarks/results/incoming/` and `--out`.
Absolute durations are ncu's (caches flushed before each launch, clocks locked): compare them with each other, not
with `moe_batch`'s CUDA-graph timings.
"""
from __future__ import annotations
import argparse, csv, glob, io, json, os, re, shutil, subprocess, sys
from pathlib import Path

from benchmarks.common import INCOMING, ROOT, gated_view, int_list, json_writer, result_head

PATHS = ("raw", "marlin", "marlin_h2")   # the raw decode, the decode over Marlin's layout, the same in packed fp16
KERNEL_OF = {("raw", "gate_up"): "moe_gate_up_kernel", ("raw", "down"): "moe_down_kernel"}
KERNEL_OF.update({(p, k): f"marlin_{k}_kernel" for p in PATHS[1:] for k in ("gate_up", "down")})

def order(paths=PATHS[:2]) -> list:
    "The (path, role) of each profiled launch of one token count, in the child's call order."
    return [(p, k) for p in paths for k in ("gate_up", "down")]
KERNEL_FILTER = "regex:^(moe|marlin)_(gate_up|down)_kernel$"
# the raw metrics kept per launch (ncu's names; a metric the report lacks is kept as None)
METRICS = {"duration": "gpu__time_duration.sum", "dram_bytes_read": "dram__bytes_read.sum",
           "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "l2_hit_pct": "lts__t_sector_hit_rate.pct", "l1_hit_pct": "l1tex__t_sector_hit_rate.pct",
           "ld_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
           "ld_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
           "registers": "launch__registers_per_thread", "waves": "launch__waves_per_multiprocessor",
           "occupancy_limit_registers": "launch__occupancy_limit_registers",
           "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
           "instructions": "smsp__inst_executed.sum", "cycles_per_issue": "smsp__average_warp_latency_per_inst_issued.ratio",
           "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed"}
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
RATIO_KEYS = ("duration", "dram_bytes_read", "instructions", "ld_sectors", "sectors_per_request", "cycles_per_issue")
GATE_RULE = ("each path's output at every token count is finite and within moe_batch.CHECK_LIMIT relative RMS of the "
             "plain fp32 version before profiling, and the report holds exactly two launches a path a token count")
FIGURES = ("launches", "ratios")


def number(s: str):
    "A raw CSV cell as a float (thousands separators dropped), or None for an empty or non-numeric cell."
    try: return float(s.replace(",", ""))
    except (AttributeError, ValueError): return None


def parse_raw_csv(text: str) -> list:
    """ncu's `--page raw --csv` export: a header row of metric names, a row of units, then one row per launch. Returns
    per launch {kernel, grid, block, metrics: {METRICS' key: value}, units: {key: unit}, stalls: {reason: cycles per
    issued instruction}} (a launch's `sectors_per_request` = ld_sectors / ld_requests)."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None: raise ValueError("moe_profile: no 'Kernel Name' column in ncu's raw CSV")
    head, units = rows[start], rows[start + 1]
    col = {name: i for i, name in enumerate(head)}
    out = []
    for r in rows[start + 2:]:
        if len(r) != len(head): continue
        get = lambda name: r[col[name]] if name in col else None
        m = {k: number(get(v)) for k, v in METRICS.items()}
        m["sectors_per_request"] = (round(m["ld_sectors"] / m["ld_requests"], 3)
                                    if m["ld_sectors"] is not None and m["ld_requests"] else None)
        out.append({"kernel": get("Kernel Name"), "grid": get("Grid Size"), "block": get("Block Size"), "metrics": m,
                    "units": {k: units[col[v]] for k, v in METRICS.items() if v in col},
                    "stalls": {STALL.match(n)[1]: number(r[i]) for n, i in col.items() if STALL.match(n) and number(r[i]) is not None}})
    return out


def label(launches: list, tokens: tuple, paths=PATHS[:2]) -> list:
    """Each launch's token count, path and kernel: the child profiles, per token count in `tokens`, each of `paths` in
    turn, gate_up then down (`order`). A report whose kernels are not those, in that order, is refused (ValueError)."""
    want = [o for _ in tokens for o in order(paths)]
    if [l["kernel"] for l in launches] != [KERNEL_OF[o] for o in want]:
        raise ValueError(f"moe_profile: the report's launches {[l['kernel'] for l in launches]} are not "
                         f"{len(tokens)} x {[KERNEL_OF[o] for o in order(paths)]}")
    counts = [M for M in tokens for _ in order(paths)]
    return [{**l, "tokens": M, "path": p, "role": k} for l, M, (p, k) in zip(launches, counts, want)]


def ratios(launches: list) -> dict:
    """Per token count, Marlin-layout path and kernel role (`marlin:gate_up`, `marlin_h2:gate_up`, ...): its launch's
    figure over the raw-layout launch's of the same role, for `RATIO_KEYS`."""
    by = {(l["tokens"], l["path"], l["role"]): l["metrics"] for l in launches}
    out = {}
    for (M, p, k), m in by.items():
        if p == "raw" or (M, "raw", k) not in by: continue
        raw = by[(M, "raw", k)]
        out.setdefault(str(M), {})[f"{p}:{k}"] = {key: (round(m[key] / raw[key], 3) if m.get(key) is not None and raw.get(key) else None)
                                                  for key in RATIO_KEYS}
    return out


def find_ncu(given: str | None) -> str | None:
    "`--ncu`, else `ncu` on PATH, else the CUDA toolkit's or a Nsight Compute install's."
    if given: return given if os.access(given, os.X_OK) else None
    for c in [shutil.which("ncu"), "/usr/local/cuda/bin/ncu", *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))]:
        if c and os.access(c, os.X_OK): return c
    return None


def prepare(tokens, paths, device: str = "cuda", shapes: dict | None = None, copies=None) -> tuple:
    """The calls to profile, per token count a list of (path, call) with its inputs bound, each checked against the
    fp32 version and run once more (compiled, warm); and the record (shapes, checks, tiles). `copies(w13, w2)` gives
    Marlin's copy of the experts (default: vLLM's repack, `moe_batch.Marlin`); `device`, `shapes` and `copies` exist for
    the CPU test (Triton's interpreter, small shapes, `moe_marlin.from_experts`)."""
    import torch
    from benchmarks.kernels import moe_batch as mb
    from benchmarks.kernels.moe_decode import REAL, random_experts, routing
    from solar_open2.vllm.ops import moe_decode as md, moe_marlin as mm
    shp = dict(shapes or REAL)
    E, K, I, H, k = (shp[x] for x in ("E", "K", "I", "H", "topk"))
    w13, w2 = random_experts(E, K, I, H, device)
    w13 = mb.shared_global_scale(w13)
    if copies is None:
        mar = mb.Marlin(w13, w2)
        m13, m2 = mm.from_vllm(mar.w1, mar.s1, mar.g1, torch.bfloat16), mm.from_vllm(mar.w2, mar.s2, mar.g2, torch.bfloat16)
    else: m13, m2 = copies(w13, w2)
    res = {"shapes": shp, "checks": [], "tiles": {}}
    calls = []
    for M in tokens:
        x = torch.randn(M, K, device=device).to(torch.bfloat16)
        ids, wts = routing(M, E, k, device, seed=1000 * M)
        ids = ids.to(torch.int32).contiguous()
        ref = md.moe_decode_torch(x, ids, wts, w13, w2)                                # [M, H] fp32
        g, d = mm.MARLIN_TILES.nearest(M)
        g2, d2 = (mm.MarlinTile(t.groups, t.k_tiles, t.num_warps, t.num_stages, half2=True) for t in (g, d))
        every = {"raw": lambda x=x, ids=ids, wts=wts: md.moe_decode_triton(x, ids, wts, w13, w2),   # bound now: called after the loop
                 "marlin": lambda x=x, ids=ids, wts=wts, g=g, d=d: mm.moe_marlin_triton(x, ids, wts, m13, m2, I, gate_up=g, down=d),
                 "marlin_h2": lambda x=x, ids=ids, wts=wts, g=g2, d=d2: mm.moe_marlin_triton(x, ids, wts, m13, m2, I, gate_up=g, down=d)}
        one = [(p, every[p]) for p in paths]
        for name, fn in one:
            res["checks"].append({"tokens": M, "path": name, **mb.check(fn(), ref)})
            fn()                                                                        # warm: compiled, autotuned
        res["tiles"][str(M)] = {"raw": [repr(t) for t in md.TILES.nearest(M)], "marlin": [repr(g), repr(d)], "marlin_h2": [repr(g2), repr(d2)]}
        calls.append(one)
    return res, calls


def child(a) -> int:
    "Under ncu: `prepare` (checks, warm-up), then one call of each path per token count inside the profiled range."
    import torch
    res, calls = prepare(a.tokens, a.paths)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for one in calls:
        for _, fn in one: fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    Path(a.child_out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def gate(res: dict) -> bool:
    from benchmarks.kernels.moe_batch import CHECK_LIMIT
    return (bool(res["checks"]) and all(c["finite"] and c["rel_rms"] < CHECK_LIMIT for c in res["checks"])
            and len(res["checks"]) == len(res.get("paths", PATHS[:2])) * len(res["tokens"]) and bool(res.get("launches"))
            and not res.get("errors"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int_list, default=(1, 8), help="token counts (each <= 8: the decode kernels' range)")
    ap.add_argument("--out", type=Path, default=None, help="also write the results here (e.g. $OUT/moe-profile)")
    ap.add_argument("--ncu", default=None, help="the ncu binary (default: on PATH, else the CUDA toolkit's)")
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                    help="what to profile (default all: the raw decode, the Marlin-layout decode, and the same in packed fp16)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    bad = [M for M in a.tokens if not 1 <= M <= 8]
    if bad: ap.error(f"--tokens: the decode kernels run 1 to 8 tokens, got {bad}")
    if a.child: return child(a)
    import torch
    if not torch.cuda.is_available(): print("moe_profile: no CUDA device", file=sys.stderr); return 2
    ncu = find_ncu(a.ncu)
    if ncu is None: print(f"moe_profile: no ncu ({a.ncu or 'not on PATH, not in /usr/local/cuda/bin or /opt/nvidia/nsight-compute'})", file=sys.stderr); return 2
    outs = [INCOMING] + ([a.out] if a.out else [])
    for d in outs: d.mkdir(parents=True, exist_ok=True)
    work = outs[-1]
    rep, raw_csv, child_json = work / "moe_profile.ncu-rep", work / "moe_profile_raw.csv", work / "moe_profile_child.json"
    res = {**result_head("moe_profile", "cuda", ROOT), "ncu": ncu, "tokens": list(a.tokens), "paths": list(a.paths), "gate_rule": GATE_RULE,
           "checks": [], "errors": []}
    res["ncu_version"] = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:]
    cmd = [ncu, "--set", "full", "--profile-from-start", "off", "-k", KERNEL_FILTER, "-f", "-o", str(rep.with_suffix("")),
           sys.executable, "-m", "benchmarks.kernels.moe_profile", "--child", "--child-out", str(child_json),
           "--tokens", ",".join(map(str, a.tokens)), "--paths", *a.paths]
    res["ncu_command"] = " ".join(cmd)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (work / "moe_profile_ncu.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0 or not child_json.exists():
        res["errors"].append(f"ncu run failed (rc {r.returncode}): {(r.stdout + r.stderr)[-1500:]}")
    else:
        c = json.loads(child_json.read_text())
        res.update(shapes=c["shapes"], checks=c["checks"], tiles=c["tiles"])
        x = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw"], capture_output=True, text=True)
        raw_csv.write_text(x.stdout)
        try:
            res["launches"] = label(parse_raw_csv(x.stdout), a.tokens, a.paths)
            res["ratios"] = ratios(res["launches"])
        except ValueError as e: res["errors"].append(str(e))
    json_writer(res, [d / "moe_profile.json" for d in outs], gate, GATE_RULE, figures=FIGURES)()
    view = gated_view(res, gate, GATE_RULE, figures=FIGURES)                    # what the files hold
    for e in res["errors"]: print("ERROR", e[:600])
    for M, per in view.get("ratios", {}).items():
        for k, q in per.items(): print(f"{M} tokens, {k} over the raw layout's:", q)
    for l in view.get("launches", []):
        m = l["metrics"]
        top = sorted(l["stalls"].items(), key=lambda kv: -kv[1])[:4]
        print(f"{l['tokens']} {l['path']:9s} {l['role']:7s} grid {l['grid']} regs {m['registers']} occ {m['achieved_occupancy_pct']} "
              f"dram {m['dram_throughput_pct']}% sectors/req {m['sectors_per_request']} inst {m['instructions']} "
              f"cpi {m['cycles_per_issue']} stalls {top}")
    print("gate", view["gate"])
    return 0 if view["gate"]["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
