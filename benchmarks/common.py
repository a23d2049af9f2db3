"""What the benchmarks share: where the repository and its results are, the CUDA-graph timer, the head of every result
JSON (command, tree, GPU, versions) and its writer, which writes nothing without the benchmark's sanity gate, the
integer-list and tile-list flags, and the plugin's kernel modules (`solar_open2.vllm.ops`, which import no vLLM)."""
import argparse, os, subprocess, sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]           # the repository
RESULTS = ROOT / "benchmarks" / "results"             # INDEX.json, current/, archive/<date>/
INCOMING = RESULTS / "incoming"                       # a new run's files, until `python -m benchmarks.index add` files them

def out_dir_default()->Path|None:
    "The second output directory of every benchmark: `$OUT` where it is set (the GPU machine returns what lands there)."
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else None

def time_graph(fns:list, reps:int)->float:
    """Microseconds per call: the calls in `fns` captured once in one CUDA graph (as the engine replays them), the graph
    replayed `reps` times, timed with CUDA events. Give each call other data (another routing, another weight copy)
    so that what one call reads is not in the 50 MB L2 from the previous one, as in the engine, where every layer
    reads other weights; replaying one call would time L2 hits."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for f in fns: f()                                          # compile + warm
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns: f()
    for _ in range(3): graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps): graph.replay()
    end.record(); torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / reps / len(fns)

def git_commit(root:Path)->str|None:
    "HEAD of the checkout at `root` (None outside git, as on a copied tree)."
    try: return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired): return None

SOURCE_GLOBS = ("solar_open2/**/*.py", "benchmarks/**/*.py", "scripts/*.py")

def source_digest(root:Path, globs=SOURCE_GLOBS)->str:
    """sha256 (16 hex digits) of the code a run executes: the package, the benchmarks and the scripts, path and bytes,
    in path order. The GPU machine's copy of the tree may carry an older `.git` than its files (runs of 2026-11-30
    and 2026-12-01 recorded an earlier commit as `git_commit`), so this, not the commit, names the code that ran."""
    import hashlib
    h, root = hashlib.sha256(), Path(root)
    for f in sorted({p for g in globs for p in root.glob(g) if p.is_file() and "__pycache__" not in p.parts}):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]

def git_dirty(root:Path)->bool|None:
    "Whether the package, benchmarks or scripts differ from HEAD in the checkout at `root` (None outside git)."
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--", "solar_open2", "benchmarks", "scripts"], cwd=root,
                           capture_output=True, text=True, timeout=10)
        return bool(r.stdout.strip()) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired): return None

def command_line(argv:list|None=None, main=None)->str:
    """How this process was started, as a user would type it: `python -m benchmarks.kernels.gemv --tokens 1` when it
    runs as a module (`main`, default `__main__`, has a spec), else `python SCRIPT ARGS`."""
    argv = list(sys.argv if argv is None else argv)
    spec = getattr(main if main is not None else sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name.removesuffix(".__main__")] if spec and spec.name else ["python", argv[0]]
    return " ".join(head + argv[1:])

def result_head(benchmark:str, device:str, root:Path, schema:int=1)->dict:
    "The fields every kernel benchmark's JSON starts with: what ran (command, tree), when, on which GPU, with which versions."
    import datetime, platform, torch
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton
        versions["triton"] = triton.__version__
    except ImportError: pass
    return {"schema": schema, "benchmark": benchmark, "command": command_line(),
            "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else device, "versions": versions,
            "git_commit": git_commit(root), "git_dirty": git_dirty(root), "source_sha256": source_digest(root)}

GATE_FIELDS = ("best", "step_us")     # a kernel benchmark's summary figures, withheld when its gate fails

def gated_view(res:dict, gate:Callable[[dict], bool], rule:str, figures:tuple=GATE_FIELDS)->dict:
    """What a kernel benchmark's JSON holds: `res` with `gate` = {passed, rule}, the verdict of `gate(res)` on its
    correctness checks. When the gate fails, the summary figures (`figures`: the best timings, the step totals) move
    to `withheld`, so no file reports a figure of a kernel that computed the wrong thing; the timings and the checks
    stay, as the record. A gate that cannot decide yet (no check run) counts as not passed."""
    try: passed = bool(gate(res))
    except (KeyError, TypeError, ValueError, IndexError): passed = False       # a check missing or malformed
    out = {**res, "gate": {"passed": passed, "rule": rule}}
    if not passed:
        held = {k: out.pop(k) for k in figures if out.get(k)}
        if held: out["withheld"] = held
    return out

def json_writer(res:dict, paths, gate:Callable[[dict], bool], rule:str, figures:tuple=GATE_FIELDS)->Callable[[], None]:
    """`save()`: the gated view of `res` (`gated_view`) as JSON to every path in `paths` (parents created); the
    benchmarks call it after every timing. `gate` and `rule` are required: a result is never written without them."""
    import json
    if not callable(gate) or not rule: raise TypeError("json_writer needs the benchmark's sanity gate and its rule")
    def save():
        text = json.dumps(gated_view(res, gate, rule, figures), indent=1)
        for p in paths:
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            Path(p).write_text(text)
    return save

def int_list(s:str)->tuple:
    "argparse type: comma-separated integers."
    try: return tuple(int(v) for v in s.split(","))
    except ValueError: raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")

def tile_list(s:str)->tuple:
    "argparse type: comma-separated tiles, each `x`-separated integers (`2x512x4x3,1x1024x4x3`)."
    try: return tuple(tuple(int(v) for v in p.split("x")) for p in s.split(","))
    except ValueError: raise argparse.ArgumentTypeError(f"expected tiles of x-separated integers, comma-separated (2x512x4x3,...), got {s!r}")

def kind_tile(s:str, warps:bool)->tuple|None:
    """One `KIND:NxKxWARPS[xSTAGES]` tile (`warps`), or one `KIND:NxK[xSTAGES]` tile at the launch's warps or `same`
    (None) otherwise, KIND fma or mma: the tiles of chapter 08i's pair GEMV for its two weights."""
    if s == "same" and not warps: return None
    kind, _, t = s.partition(":")
    try: tile = tuple(int(v) for v in t.split("x"))
    except ValueError: tile = ()
    if kind not in ("fma", "mma") or len(tile) not in ((3, 4) if warps else (2, 3)):
        raise argparse.ArgumentTypeError(f"expected KIND:{'NxKxWARPS[xS]' if warps else 'NxK[xS] or same'} with KIND fma or mma, got {s!r}")
    return kind, tile

def kind_tiles0(s:str)->tuple:
    "argparse type: comma-separated `kind_tile(..., warps=True)` (a pair GEMV's first weight)."
    return tuple(kind_tile(p, True) for p in s.split(","))

def kind_tiles1(s:str)->tuple:
    "argparse type: comma-separated `kind_tile(..., warps=False)` (a pair GEMV's second weight)."
    return tuple(kind_tile(p, False) for p in s.split(","))

def add_run_args(ap:argparse.ArgumentParser, reps:int, deadline_s:float, no_op:bool=False)->None:
    "The flags every kernel benchmark shares: --reps, --deadline-s, --out (default $OUT) and, for the plugin's kernels, --no-op."
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--deadline-s", type=float, default=deadline_s, help="start no timing after this many seconds")
    if no_op: ap.add_argument("--no-op", action="store_true", help="accepted for older command lines; no effect (the kernels import no vLLM)")
    ap.add_argument("--out", type=Path, default=out_dir_default(), help="also write the JSON here (default $OUT)")
    ap.add_argument("--results-dir", type=Path, default=INCOMING, help="where the JSON is written (default "
                    "benchmarks/results/incoming/: file it with `python -m benchmarks.index add`)")

def result_paths(name:str, results:Path, out:Path|None)->list|None:
    "Where `name`.json goes (the results directory, and --out when set); None, with a message, on a machine without CUDA."
    import torch
    if not torch.cuda.is_available():
        print(f"{name}: no CUDA device", file=sys.stderr); return None
    return [results / f"{name}.json"] + ([out / f"{name}.json"] if out else [])

def plugin_module(name:str, no_op:bool|None=None):
    """`solar_open2.vllm.ops.<name>`: the plugin's kernels, which import nothing of vLLM, so a GPU machine without vLLM
    runs them as they are. (`no_op` is accepted for older callers and does nothing.)"""
    import importlib
    return importlib.import_module(f"solar_open2.vllm.ops.{name}")

def run_logged(cmd:list, log:Path, timeout_s:float, env:dict|None=None, cwd:Path|None=None, grace_s:float=15.0)->int:
    """Run `cmd` in a session of its own, its output streamed into `log` as it comes (a hung or killed child leaves
    what it printed), and return its exit status. Past `timeout_s`: SIGABRT to the whole process group first, so that
    every Python process in it (the child, vLLM's engine core and workers) with `PYTHONFAULTHANDLER` set (this function
    sets it) prints where each of its threads stood; after `grace_s` SIGKILL to what is left; a last line says so, and
    the status is 124, as `timeout`'s."""
    import contextlib, signal
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try: return p.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired: pass
        with contextlib.suppress(ProcessLookupError): os.killpg(p.pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired): p.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError): os.killpg(p.pid, signal.SIGKILL)   # what is left of the group
        p.wait()
        f.write(f"\n[run_logged: no exit after {timeout_s:.0f} s; process group {p.pid} sent SIGABRT (tracebacks above), then SIGKILL]\n")
    return 124

def child_timeout(deadline_s:float, elapsed_s:float, grace_s:float=60.0)->float:
    """Seconds one engine of a GPU check may run (`run_logged`'s limit): what is left of the check's deadline, plus
    `grace_s` for an engine started just before it (none starts after it); at least `grace_s`. A caller's own time limit
    must allow `deadline_s + grace_s` and the reference's minute after it, or it kills the driver first (on 2026-12-07 a
    520 s limit over `--deadline-s 480` lost two finished speculative runs with a hung third)."""
    return max(grace_s, deadline_s - elapsed_s + grace_s)
