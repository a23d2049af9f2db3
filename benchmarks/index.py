"""`benchmarks/results/INDEX.json`: every result file the project keeps, what it holds, and which figures are current.

    python -m benchmarks.index check                       # the index against the files (exit 1 with the problems)
    python -m benchmarks.index list [--current]            # one line per file
    python -m benchmarks.index figures                     # the current figures: name, value, gate, file
    python -m benchmarks.index add FILE --what TEXT [--current [--supersedes OLD]] [--run NAME] [--figure NAME=KEY ...]

`results/current/` holds exactly the files the chapters and the README read; `results/archive/<date>/` holds the
rest, by the UTC date of the run. Each entry of `files` names its file (relative to `benchmarks/results/`), where it
was before the index existed (`was`), the run (`run`: a variant or label), the tree that ran it (`commit`; the
commit that added the file to the repository is `added_in`, and where the two differ a `note` says why), the
`date`, the `gpu`, and either `current: true` or `superseded_by` (a file, or null for a record that nothing
replaces: a failed run, a log, a diagnostic). `figures` maps each current figure's name to its file and the key of
the figure inside it, with the verdict of its sanity gate as recorded when the figure was indexed; `named` gives
the other current inputs of chapter 09 a name (a kept trace, the runs a comparison needs, the latest parity report),
so that the chapter reads every file through the index.

A new run's files land in `benchmarks/results/incoming/` (or `$OUT` on the GPU machine); `add` moves one into
`current/` or `archive/<date>/` and writes its entry, and refuses to overwrite anything.
"""
from __future__ import annotations
import argparse, datetime, json, re, shutil, subprocess, sys
from pathlib import Path

from benchmarks.common import INCOMING, RESULTS, ROOT

INDEX = RESULTS / "INDEX.json"
SCHEMA = 1
FIELDS = ("file", "was", "kind", "run", "what", "commit", "added_in", "date", "gpu", "current", "superseded_by")
KINDS = ("engine", "engine-ab", "engine-merged", "engine-log", "driver-log", "trace", "kernel", "parity", "parity-log",
         "chat", "chat-log", "explore", "explore-notes", "log", "plot", "install-log", "compare")
DATE = re.compile(r"\d{4}-\d\d-\d\d")
GATES = ("passed", "failed", "unchecked")

def load(path:Path=INDEX)->dict:
    "The index as a dict (`files`: a list of entries, `figures`: name -> {file, key, gate, what})."
    return json.loads(Path(path).read_text())

def _by_name(index:dict)->dict:
    out = {}
    for e in index["files"]:
        out.setdefault(Path(e["file"]).name, []).append(e)
    return out

def entry(name:str, index:dict|None=None)->dict:
    """The entry of one file, by its name (`perf_h200_graphs_gk3.json`) or its path under `benchmarks/results/`;
    a KeyError names the file when the index does not hold it."""
    index = index or load()
    hits = [e for e in index["files"] if e["file"] == name] or _by_name(index).get(Path(name).name, [])
    if len(hits) != 1: raise KeyError(f"benchmarks/results/INDEX.json: {name!r} is {'not indexed' if not hits else 'ambiguous'}")
    return hits[0]

def path(name:str, index:dict|None=None)->Path:
    "Where an indexed file is now (current/ or archive/<date>/), by name or old path."
    return RESULTS / entry(name, index)["file"]

def current(name:str, index:dict|None=None)->Path:
    "The path of a current file; a ValueError when the file is archived (what the chapters read must be current)."
    e = entry(name, index)
    if not e["current"]: raise ValueError(f"{name}: archived as {e['file']} (superseded by {e['superseded_by']}), not current")
    return RESULTS / e["file"]

def read(name:str, index:dict|None=None):
    "An indexed JSON (or JSON-lines) file's contents, by name."
    p = path(name, index)
    if p.suffix == ".jsonl": return [json.loads(l) for l in p.read_text().splitlines() if l.strip()]
    if p.name.endswith(".json.gz"):
        import gzip
        with gzip.open(p, "rt") as f: return json.load(f)
    return json.loads(p.read_text())

def named(name:str, index:dict|None=None)->Path|list:
    "A named current input (`named` in the index): its path, or the list of its paths."
    index = index or load()
    if name not in index.get("named", {}): raise KeyError(f"INDEX.json names no {name!r} (has {sorted(index.get('named', {}))})")
    v = index["named"][name]["files"]
    return [current(f, index) for f in v] if isinstance(v, list) else current(v, index)

def figure(name:str, index:dict|None=None)->dict:
    """One current figure: its index entry (file, key, gate, what) plus the figure itself as the file holds it
    (`value`), read without the gate (`gate` says whether it is a result)."""
    index = index or load()
    if name not in index["figures"]: raise KeyError(f"INDEX.json has no figure {name!r} (has {sorted(index['figures'])})")
    f = dict(index["figures"][name])
    f["value"] = read(f["file"], index)["figures"][f["key"]]
    return f

def gate_of(result:dict, key:str)->str:
    "The sanity gate's verdict on figure `key` of an engine result JSON: passed, failed or unchecked."
    from benchmarks.engine.perf.results import gated
    g = gated(result, strict=False)
    if key in g["figures"]: return "passed"
    why = g["gated_out"].get(key, {}).get("why")
    if why is None: raise KeyError(f"no figure {key!r}")
    return "failed" if why == "the check failed" else "unchecked"

def on_disk(root:Path=RESULTS)->list:
    "Every file under `root` but the index itself, as paths relative to `root`."
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file() and p != root / INDEX.name)

def problems(index:dict|None=None, root:Path=RESULTS)->list:
    "What is wrong with the index against the files (an empty list: nothing)."
    index = index or load(root / INDEX.name)
    out, files = [], [e["file"] for e in index["files"]]
    disk = set(on_disk(root))
    out += [f"{f}: on disk, not in INDEX.json" for f in sorted(disk - set(files))]
    out += [f"{f}: in INDEX.json, not on disk" for f in sorted(set(files) - disk)]
    out += [f"{f}: indexed twice" for f in sorted({f for f in files if files.count(f) > 1})]
    names = [Path(f).name for f in files]
    out += [f"{n}: two files of this name" for n in sorted({n for n in names if names.count(n) > 1})]
    for e in index["files"]:
        f = e["file"]
        if set(e) - set(FIELDS) - {"note", "script", "recorded_commit", "config"}: out.append(f"{f}: unknown fields {sorted(set(e) - set(FIELDS))}")
        if any(k not in e for k in FIELDS): out.append(f"{f}: missing {[k for k in FIELDS if k not in e]}")
        if e.get("kind") not in KINDS: out.append(f"{f}: kind {e.get('kind')!r} is not one of {KINDS}")
        parts = Path(f).parts
        if e.get("current") is True:
            if parts[0] != "current" or len(parts) != 2: out.append(f"{f}: current, but not directly under current/")
            if e.get("superseded_by"): out.append(f"{f}: current and superseded")
        else:
            if not (parts[0] == "archive" and len(parts) >= 3 and DATE.fullmatch(parts[1])):
                out.append(f"{f}: not current, so it belongs under archive/<YYYY-MM-DD>/")
            elif e.get("date") and parts[1] != e["date"]: out.append(f"{f}: archived under {parts[1]}, run date {e['date']}")
            s = e.get("superseded_by")
            if s is not None and s not in files: out.append(f"{f}: superseded by {s}, which is not indexed")
        if not (e.get("date") and DATE.fullmatch(e["date"])): out.append(f"{f}: date {e.get('date')!r} is not YYYY-MM-DD")
        if not (e.get("what") or "").strip(): out.append(f"{f}: says nothing about what it holds")
        for k in ("commit", "added_in"):
            if e.get(k) is not None and not re.fullmatch(r"[0-9a-f]{7,40}", e[k]): out.append(f"{f}: {k} {e[k]!r} is not a commit")
    by_file = {e["file"]: e for e in index["files"]}
    for name, fig in index.get("figures", {}).items():
        e = by_file.get(fig.get("file"))
        if e is None: out.append(f"figure {name}: file {fig.get('file')} is not indexed"); continue
        if not e["current"]: out.append(f"figure {name}: {fig['file']} is archived: a figure is read from current/ only")
        if fig.get("gate") not in GATES: out.append(f"figure {name}: gate {fig.get('gate')!r} is not one of {GATES}")
        try:
            res = json.loads((root / fig["file"]).read_text())
            if fig["key"] not in (res.get("figures") or {}) and fig["key"] not in (res.get("gated_out") or {}):
                out.append(f"figure {name}: {fig['file']} has no figure {fig['key']!r}")
            elif res.get("phase") in ("eager", "graphs") and gate_of(res, fig["key"]) != fig["gate"]:
                out.append(f"figure {name}: recorded gate {fig['gate']}, the file says {gate_of(res, fig['key'])}")
        except (OSError, json.JSONDecodeError) as err: out.append(f"figure {name}: {fig['file']}: {err}")
    for name, n in index.get("named", {}).items():
        fs = n.get("files"); fs = fs if isinstance(fs, list) else [fs]
        if not (n.get("what") or "").strip(): out.append(f"named {name}: says nothing about what it is")
        for f in fs:
            if f not in by_file: out.append(f"named {name}: {f} is not indexed")
            elif not by_file[f]["current"]: out.append(f"named {name}: {f} is archived: chapter 09 reads current/ only")
    return out

def _git(*args)->str|None:
    try: return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired): return None

def add(src:Path, what:str, current:bool=False, run:str|None=None, supersedes:str|None=None, figures:dict|None=None,
        index_path:Path=INDEX, kind:str|None=None, root:Path=RESULTS)->dict:
    """File one new result: move `src` (from incoming/ or anywhere) to current/ or archive/<run date>/, write its
    entry; with `supersedes` (a current file it replaces), archive that one and point it here. Refuses to overwrite a
    file or to index a name twice. Returns the new entry."""
    src = Path(src)
    if not src.is_file(): raise FileNotFoundError(f"{src}: no such result file")
    index = load(index_path)
    if Path(src.name).name in _by_name(index): raise FileExistsError(f"{src.name}: a file of this name is already indexed")
    head = {}
    if src.suffix == ".json":
        try: head = json.loads(src.read_text())
        except json.JSONDecodeError as e: raise ValueError(f"{src}: not JSON ({e})") from None
    date = (head.get("started_utc") or datetime.datetime.now(datetime.timezone.utc).isoformat())[:10]
    gpu = head.get("gpu")
    if isinstance(gpu, dict): gpu = f"{gpu.get('count', 1)}x {gpu.get('name')}" if gpu.get("count", 1) > 1 else gpu.get("name")
    rel = f"current/{src.name}" if current else f"archive/{date}/{src.name}"
    dest = root / rel
    if dest.exists(): raise FileExistsError(f"{dest}: exists; refusing to overwrite")
    e = {"file": rel, "was": None, "kind": kind or ("engine" if head.get("benchmark") == "perf_h200" else "kernel" if head.get("benchmark") else "log"),
         "run": run or (head.get("settings") or {}).get("variant") or src.stem, "what": what,
         "commit": (head.get("git_commit") or "")[:7] or None, "added_in": None, "date": date, "gpu": gpu,
         "current": bool(current), "superseded_by": None}
    gate = lambda key: gate_of(head, key) if head.get("phase") in ("eager", "graphs") else "passed"
    figures = dict(figures or {})
    old = None
    if supersedes:                                   # everything checked before anything moves
        old = entry(supersedes, index)
        if not old["current"]: raise ValueError(f"{supersedes}: not current, nothing to supersede")
        new_old = f"archive/{old['date']}/{Path(old['file']).name}"
        if (root / new_old).exists(): raise FileExistsError(f"{root / new_old}: exists; refusing to overwrite")
        figures.update({n: f["key"] for n, f in index["figures"].items() if f["file"] == old["file"] and n not in figures})
    for name, key in figures.items():
        if key not in (head.get("figures") or {}) and key not in (head.get("gated_out") or {}):
            raise ValueError(f"{src}: no figure {key!r} for {name}")
    if old is not None:
        (root / new_old).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(root / old["file"]), str(root / new_old))
        old.update(file=new_old, current=False, superseded_by=rel)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dest))
    index["files"].append(e)
    for name, key in figures.items():
        index["figures"][name] = {"file": rel, "key": key, "what": index["figures"].get(name, {}).get("what") or what, "gate": gate(key)}
    write(index, index_path)
    return e

def write(index:dict, path:Path=INDEX)->None:
    "The index as JSON, entries in path order."
    index["files"].sort(key=lambda e: e["file"])
    Path(path).write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n")

def main(argv:list|None=None)->int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.index", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="the index against the files")
    ls = sub.add_parser("list", help="one line per file"); ls.add_argument("--current", action="store_true")
    sub.add_parser("figures", help="the current figures")
    ad = sub.add_parser("add", help="file one new result")
    ad.add_argument("file", type=Path, help=f"the result file (typically under {INCOMING.relative_to(ROOT)}/)")
    ad.add_argument("--what", required=True, help="what it holds, one line")
    ad.add_argument("--current", action="store_true", help="a chapter or the README reads it (else: archive)")
    ad.add_argument("--supersedes", help="the current file it replaces (moved to the archive)")
    ad.add_argument("--run", help="the run's name (default: the JSON's variant, else the file's stem)")
    ad.add_argument("--kind", choices=KINDS)
    ad.add_argument("--figure", action="append", default=[], metavar="NAME=KEY", help="a current figure it holds (repeat)")
    a = ap.parse_args(argv)
    if a.cmd == "check":
        ps = problems()
        for p in ps: print(p)
        print(f"{len(load()['files'])} files indexed; {len(ps)} problems")
        return 1 if ps else 0
    if a.cmd == "list":
        for e in load()["files"]:
            if a.current and not e["current"]: continue
            print(f"{e['file']:72s} {e['date']} {e['kind']:14s} {'current' if e['current'] else 'superseded by ' + str(e['superseded_by'])}")
        return 0
    if a.cmd == "figures":
        for n in load()["figures"]:
            f = figure(n)
            print(f"{n:34s} {f['value'].get('value_tok_s', float('nan')):10.1f} tok/s  gate {f['gate']:9s} {f['file']}")
        return 0
    figs = {}
    for s in a.figure:
        n, sep, k = s.partition("=")
        if not sep or not n or not k: ap.error(f"--figure {s!r}: expected NAME=KEY")
        figs[n] = k
    if a.supersedes and not a.current: ap.error("--supersedes needs --current")
    try: e = add(a.file, a.what, a.current, a.run, a.supersedes, figs, kind=a.kind)
    except (FileNotFoundError, FileExistsError, KeyError, ValueError) as err: ap.error(str(err))
    print(json.dumps(e, indent=1))
    return 0

if __name__ == "__main__":
    sys.exit(main())
