"""The same GPU runs on two source trees, and whether they agree: the plugin's parity tokens, and one TP2 rank's step.

    python -m benchmarks.engine.compare stage --commit bfd3b63 --dest .stage/old      # here: the old tree's code
    python -m benchmarks.engine.compare run --tree .stage/old --what rank,parity --out $OUT/old   # GPU: one tree
    python -m benchmarks.engine.compare run --tree . --what rank,parity --out $OUT/new
    python -m benchmarks.engine.compare report OLD_DIR NEW_DIR [--out compare.json]    # here: the verdict

`stage` writes the code of an older commit (the package, the benchmarks, the scripts, setup.py and settings.ini: no
results, a few MB) into `--dest` inside this repository, so that it travels to the GPU machine with the working
tree; it refuses a non-empty destination. `run` starts, in a child process whose PYTHONPATH and working directory
are that tree, the tree's own command for

* `parity`: the GPU parity run on the tiny NVFP4 checkpoint with CUDA graphs and the plugin's MoE kernels
  (`compressed-tensors:graphs:bfloat16`, `--moe-backend emulation`, the plugin's defaults, 64 greedy tokens for each
  of five prompts, alone and batched); `scripts/gpu_parity.py` in trees before the benchmarks became a package,
  `python -m benchmarks.engine.parity` after;
* `rank`: the engine benchmark's single-stream decode of one TP2 rank on one GPU (`--config rank --phase graphs
  --only decode --decode-contexts 2048 --moe-backend emulation`, the plugin's defaults); `benchmarks/perf_h200.py`
  before, `python -m benchmarks.engine.perf` after.

Each run writes its JSON (`gpu_parity_compare_<layout>.json`, `perf_h200_rank_graphs_compare_<layout>.json`, names
that can be indexed side by side), its logs and `<what>_compare_run.json` (the command, the tree, the exit code, the wall time)
under `--out`. `report` reads two such directories and writes the verdict: the same tokens for every prompt (alone
and batched) and both parity runs passed; the median inter-token time of the two rank runs within `--tolerance`
(default 2 %), both figures through their sanity gate. Exit 0 when everything agrees, 1 when not, 2 on bad input.
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, time
from pathlib import Path

from benchmarks.common import ROOT, command_line, out_dir_default

STAGED = ("solar_open2", "benchmarks", "scripts", "setup.py", "settings.ini")   # what a run needs of a tree
RUN_FILE = "compare_run.json"
PARITY_CASE = "compressed-tensors:graphs:bfloat16"
PERF_ARGS = ["--config", "rank", "--phase", "graphs", "--only", "decode", "--decode-contexts", "2048", "--moe-backend", "emulation"]
FIGURE = "decode_bs1_ctx2048"

def layout(tree:Path)->str:
    "`package` (benchmarks/engine/perf/ exists) or `scripts` (benchmarks/perf_h200.py, scripts/gpu_parity.py)."
    tree = Path(tree)
    if (tree / "benchmarks" / "engine" / "perf" / "__init__.py").exists(): return "package"
    if (tree / "benchmarks" / "perf_h200.py").exists() and (tree / "scripts" / "gpu_parity.py").exists(): return "scripts"
    raise ValueError(f"{tree}: neither layout of the benchmarks (no benchmarks/engine/perf/, no benchmarks/perf_h200.py)")

def run_command(tree:Path, what:str, out:Path, deadline_s:float, python:str=sys.executable)->list:
    "The tree's own command line for one run, writing into `out`."
    kind = layout(tree)
    if what == "parity":
        head = [python, "-m", "benchmarks.engine.parity"] if kind == "package" else [python, "scripts/gpu_parity.py"]
        return head + ["--cases", PARITY_CASE, "--moe-backend", "emulation", "--name", f"gpu_parity_compare_{kind}",
                       "--out", str(out), "--deadline-s", f"{deadline_s:.0f}"]
    if what == "rank":
        head = [python, "-m", "benchmarks.engine.perf"] if kind == "package" else [python, "benchmarks/perf_h200.py"]
        return head + PERF_ARGS + ["--variant", f"compare_{kind}", "--out", str(out), "--deadline-s", f"{deadline_s:.0f}"]
    raise ValueError(f"--what {what!r}: expected parity or rank")

def child_env(tree:Path, base:dict|None=None)->dict:
    "The child's environment: the tree first on PYTHONPATH (then what was there), offline, NVLink multicast off."
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tree).resolve())] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "NCCL_NVLS_ENABLE": "0",
                "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    return env

def stage(commit:str, dest:Path, repo:Path=ROOT)->list:
    "Write the code of `commit` (STAGED paths that exist there) into `dest`; returns the paths written."
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()): raise FileExistsError(f"{dest}: not empty; refusing to write a tree into it")
    have = subprocess.run(["git", "ls-tree", "--name-only", commit], cwd=repo, capture_output=True, text=True)
    if have.returncode: raise ValueError(f"commit {commit!r}: {have.stderr.strip()}")
    paths = [p for p in STAGED if p in have.stdout.split()]
    dest.mkdir(parents=True, exist_ok=True)
    arch = subprocess.run(["git", "archive", "--format=tar", commit, "--", *paths], cwd=repo, capture_output=True)
    if arch.returncode: raise RuntimeError(arch.stderr.decode(errors="replace"))
    subprocess.run(["tar", "-x", "-C", str(dest), "--exclude=results"], input=arch.stdout, check=True)
    (dest / "STAGED_FROM").write_text(f"{commit}\n")
    return paths

def run(tree:Path, what:str, out:Path, deadline_s:float=540)->int:
    "One run of `what` on `tree` as a child process; `compare_run.json` records it. Returns the child's exit code."
    out = Path(out); out.mkdir(parents=True, exist_ok=True)
    cmd = run_command(tree, what, out, deadline_s)
    rec = {"what": what, "tree": str(tree), "layout": layout(tree), "command": cmd, "started": time.time(),
           "staged_from": (Path(tree) / "STAGED_FROM").read_text().strip() if (Path(tree) / "STAGED_FROM").exists() else None,
           "driver": command_line()}
    print(f"[compare] {' '.join(cmd)}  (cwd {tree})", flush=True)
    t = time.perf_counter()
    try: rc = subprocess.run(cmd, cwd=tree, env=child_env(tree), timeout=deadline_s + 60).returncode
    except subprocess.TimeoutExpired: rc = 124
    rec.update(returncode=rc, wall_s=round(time.perf_counter() - t, 1))
    (out / f"{what}_{RUN_FILE}").write_text(json.dumps(rec, indent=1) + "\n")
    return rc

def _one(d:Path, pattern:str)->dict|None:
    fs = sorted(Path(d).rglob(pattern))
    return json.loads(fs[0].read_text()) if fs else None

def report(old:Path, new:Path, tolerance:float=0.02)->dict:
    "The verdict on two run directories (`run`'s --out of each tree)."
    from benchmarks.engine.perf.results import gated
    out = {"old": str(old), "new": str(new), "tolerance": tolerance, "problems": []}
    po, pn = _one(old, "gpu_parity_compare_*.json"), _one(new, "gpu_parity_compare_*.json")
    if po is None or pn is None: out["problems"].append(f"parity: no gpu_parity_compare_*.json under {old if po is None else new}")
    else:
        to = {k: v.get("tokens") for k, v in po.get("runs", {}).items() if "tokens" in v}
        tn = {k: v.get("tokens") for k, v in pn.get("runs", {}).items() if "tokens" in v}
        same = {k: to.get(k) == tn.get(k) for k in sorted(set(to) | set(tn))}
        bat = {k: (po["runs"][k].get("batched_equals_single"), pn["runs"][k].get("batched_equals_single")) for k in to if k in tn}
        out["parity"] = {"old_passed": po.get("passed"), "new_passed": pn.get("passed"), "same_tokens": same,
                         "batched_equals_single": bat, "old_failures": po.get("failures"), "new_failures": pn.get("failures")}
        if not same or not all(same.values()): out["problems"].append(f"parity: tokens differ in {[k for k, v in same.items() if not v] or 'every case (none compared)'}")
        if not (po.get("passed") and pn.get("passed")): out["problems"].append("parity: a run did not pass against the fp32 reference")
    ro, rn = _one(old, "perf_h200_rank_graphs_compare_*.json"), _one(new, "perf_h200_rank_graphs_compare_*.json")
    if ro is None or rn is None: out["problems"].append(f"rank: no perf_h200_rank_graphs_compare_*.json under {old if ro is None else new}")
    else:
        go, gn = gated(ro, strict=False), gated(rn, strict=False)
        med = lambda r: (r.get("figure_details") or {}).get(FIGURE, {}).get("itl_median_ms")
        mo, mn = med(ro), med(rn)
        out["rank"] = {"old_median_ms": mo, "new_median_ms": mn, "new_over_old": mn / mo if mo and mn else None,
                       "old_tok_s": (ro.get("figures") or {}).get(FIGURE, {}).get("value_tok_s"),
                       "new_tok_s": (rn.get("figures") or {}).get(FIGURE, {}).get("value_tok_s"),
                       "gate": {"old": FIGURE in go["figures"], "new": FIGURE in gn["figures"]},
                       "source_sha256": {"old": ro.get("source_sha256"), "new": rn.get("source_sha256")}}
        if not (mo and mn): out["problems"].append("rank: a run has no median inter-token time")
        elif abs(mn / mo - 1) > tolerance: out["problems"].append(f"rank: median step {mn:.3f} ms against {mo:.3f} ms, beyond {tolerance:.0%}")
        if not all(out["rank"]["gate"].values()): out["problems"].append("rank: a figure failed its sanity gate")
    out["agree"] = not out["problems"]
    return out

def main(argv:list|None=None)->int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine.compare", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stage", help="write an older commit's code into the repository, to travel to the GPU machine")
    st.add_argument("--commit", required=True); st.add_argument("--dest", type=Path, required=True)
    rn = sub.add_parser("run", help="one run on one tree (on the GPU machine)")
    rn.add_argument("--tree", type=Path, required=True, help="a tree written by `stage`, or . for this one")
    rn.add_argument("--what", required=True, help="parity, rank, or both in order (rank,parity)")
    rn.add_argument("--out", type=Path, default=out_dir_default(), help="where its files go (default $OUT)")
    rn.add_argument("--deadline-s", type=float, default=270, help="each run's deadline (the child's own)")
    rp = sub.add_parser("report", help="the verdict on two run directories")
    rp.add_argument("old", type=Path); rp.add_argument("new", type=Path)
    rp.add_argument("--tolerance", type=float, default=0.02); rp.add_argument("--out", type=Path, help="also write the verdict here")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "stage":
            print(f"staged {', '.join(stage(a.commit, a.dest))} of {a.commit} into {a.dest}"); return 0
        if a.cmd == "run":
            if a.out is None: ap.error("run: --out (or $OUT) is required")
            whats = [w.strip() for w in a.what.split(",") if w.strip()]
            if not whats or set(whats) - {"parity", "rank"}: ap.error(f"--what {a.what!r}: parity, rank, or both (comma-separated)")
            layout(a.tree)                                              # a bad tree fails before anything starts
            return max([run(a.tree, w, a.out, a.deadline_s) for w in whats])    # every run, whatever the one before did
        for d in (a.old, a.new):
            if not Path(d).is_dir(): ap.error(f"report: {d} is not a directory")
        v = report(a.old, a.new, a.tolerance)
    except (ValueError, FileExistsError, RuntimeError) as e: ap.error(str(e))
    text = json.dumps(v, indent=1)
    if a.out: Path(a.out).write_text(text + "\n")
    print(text)
    return 0 if v["agree"] else 1

if __name__ == "__main__":
    sys.exit(main())
