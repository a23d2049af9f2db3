"""`benchmarks/results/INDEX.json` against the files and against what reads them: every file indexed, nothing indexed
that is gone, current/ holding exactly what the chapters and the README read, chapter 09 and the README reading only
current/, and `python -m benchmarks.index add` filing a new run without overwriting anything."""
import json, re, shutil
from pathlib import Path

import pytest

from benchmarks import index
from benchmarks.common import RESULTS

ROOT = Path(__file__).resolve().parents[1]
IDX = index.load()
NAMES = {Path(e["file"]).name: e for e in IDX["files"]}
HISTORY = "09a_perf_history.ipynb"


def _sources(nb:Path)->str:
    return "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])

def _mentioned(text:str)->set:
    "The indexed files a text names (by file name, anywhere: a path, a string in code, a citation)."
    return {n for n in NAMES if re.search(r"(?<![\w.-])" + re.escape(n) + r"(?![\w.-])", text)}

def _measured_section()->str:
    "The README's part that is this project's measurements (from nbs/index.ipynb: 'What has been measured')."
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^## What has been measured\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "README.md has no 'What has been measured' section"
    return m.group(1)


def test_the_index_matches_the_files():
    assert index.problems() == []
    assert len(IDX["files"]) >= 171 and not (RESULTS / "gpu").exists()                 # every file of the old layout is indexed


def test_the_index_catches_what_it_should(tmp_path):
    "A copy of the results with one file added, one removed, one entry misplaced: each problem is named."
    root = tmp_path / "results"
    shutil.copytree(RESULTS, root)
    (root / "current" / "stray.json").write_text("{}")
    gone = next(e for e in IDX["files"] if not e["current"])
    (root / gone["file"]).unlink()
    idx = json.loads((root / "INDEX.json").read_text())
    moved = next(e for e in idx["files"] if e["current"] and e["kind"] == "kernel")
    moved["current"] = False
    idx["figures"]["tp2.decode_bs1_ctx2048"]["gate"] = "failed"
    (root / "INDEX.json").write_text(json.dumps(idx))
    ps = index.problems(idx, root)
    assert "current/stray.json: on disk, not in INDEX.json" in ps and f"{gone['file']}: in INDEX.json, not on disk" in ps
    assert f"{moved['file']}: not current, so it belongs under archive/<YYYY-MM-DD>/" in ps
    assert any(p.startswith("figure tp2.decode_bs1_ctx2048: recorded gate failed, the file says passed") for p in ps)


def test_chapter_09_and_the_readme_read_only_current_files():
    for where, text in (("nbs/09_performance.ipynb", _sources(ROOT / "nbs" / "09_performance.ipynb")), ("README.md", _measured_section())):
        archived = sorted(n for n in _mentioned(text) if not NAMES[n]["current"])
        assert not archived and "archive/" not in text, (where, archived)
    for name in list(IDX["figures"]) + list(IDX["named"]):                              # what 09 reads by name
        paths = index.named(name) if name in IDX["named"] else [index.current(IDX["figures"][name]["file"])]
        assert all(p.parent.name == "current" for p in (paths if isinstance(paths, list) else [paths]))


def test_current_holds_exactly_what_is_read():
    "Each current file is named by a chapter other than the history, by the README, or by the index's figures and names."
    read = set()
    for nb in (ROOT / "nbs").rglob("*.ipynb"):
        if nb.name != HISTORY: read |= _mentioned(_sources(nb))
    read |= _mentioned((ROOT / "README.md").read_text())
    read |= {Path(f["file"]).name for f in IDX["figures"].values()}
    read |= {Path(f).name for n in IDX["named"].values() for f in (n["files"] if isinstance(n["files"], list) else [n["files"]])}
    current = {n for n, e in NAMES.items() if e["current"]}
    assert current - read == set(), sorted(current - read)                              # nothing current that nothing reads
    assert {n for n in read if n in NAMES} <= current, sorted({n for n in read if n in NAMES} - current)


def test_current_figures_and_their_gates():
    "The figures chapter 09 tables: each read from its file, with the gate's verdict the file gives (index.problems checks it)."
    figs = {n: index.figure(n) for n in IDX["figures"]}
    assert figs["tp2.decode_bs1_ctx2048"]["gate"] == "passed" and round(figs["tp2.decode_bs1_ctx2048"]["value"]["value_tok_s"], 1) == 186.3
    assert all(f["gate"] == "failed" for n, f in figs.items() if n.endswith(".marlin"))    # every Marlin run repeated one token id
    with pytest.raises(KeyError, match="no figure"): index.figure("tp2.nope")
    with pytest.raises(ValueError, match="not current"): index.current(next(n for n, e in NAMES.items() if not e["current"]))


def test_explore_scripts_are_gone_and_named_by_commit():
    "The exploration prototypes left the tree; each result they recorded names the script and the commit that holds it."
    assert not [p for p in (ROOT / "benchmarks").rglob("*_explore")] and not list((ROOT / "benchmarks" / "explore").glob("*.py"))
    ex = [e for e in IDX["files"] if e["kind"] == "explore"]
    assert len(ex) == 14 and all(re.fullmatch(r"benchmarks/\w+_explore/\w+\.py", e["script"]) and re.fullmatch(r"[0-9a-f]{7}", e["commit"])
                                 and f"git show {e['commit']}:{e['script']}" in e["what"] for e in ex)
    for md in (ROOT / "benchmarks" / "explore").glob("*.md"):
        assert "A frozen record" in md.read_text() and "git show COMMIT:" in md.read_text(), md


def test_add_files_a_new_run_and_refuses_to_overwrite(tmp_path):
    root = tmp_path / "results"
    (root / "current").mkdir(parents=True)
    old = {"schema": 2, "benchmark": "perf_h200", "phase": "graphs", "config": "rank", "started_utc": "2026-12-01T08:24:10+00:00",
           "git_commit": "8a03d53b" + "0" * 32, "gpu": {"name": "NVIDIA H200", "count": 1},
           "settings": {"variant": "old"}, "figures": {"decode_bs1_ctx2048": {"value_tok_s": 200.0}},
           "sanity": {"decode_bs1_ctx2048": {"passed": True, "degenerate": False}}}
    (root / "current" / "old.json").write_text(json.dumps(old))
    idx_path = root / "INDEX.json"
    index.write({"schema": 1, "figures": {"rank.x": {"file": "current/old.json", "key": "decode_bs1_ctx2048", "what": "w", "gate": "passed"}},
                 "named": {}, "files": [{"file": "current/old.json", "was": None, "kind": "engine", "run": "old", "what": "w",
                                         "commit": "8a03d53", "added_in": None, "date": "2026-12-01", "gpu": "NVIDIA H200",
                                         "current": True, "superseded_by": None}]}, idx_path)
    new = tmp_path / "incoming" / "new.json"; new.parent.mkdir()
    new.write_text(json.dumps({**old, "started_utc": "2026-12-05T01:00:00+00:00", "settings": {"variant": "new"},
                               "figures": {"decode_bs1_ctx2048": {"value_tok_s": 210.0}},
                               "sanity": {"decode_bs1_ctx2048": {"passed": False, "degenerate": True}}}))
    e = index.add(new, "a new run", current=True, supersedes="old.json", figures={"rank.y": "decode_bs1_ctx2048"},
                  index_path=idx_path, root=root)
    idx = json.loads(idx_path.read_text())
    assert (e["file"], e["run"], e["date"], e["gpu"], e["commit"]) == ("current/new.json", "new", "2026-12-05", "NVIDIA H200", "8a03d53")
    assert not new.exists() and (root / "current" / "new.json").exists() and (root / "archive" / "2026-12-01" / "old.json").exists()
    old_e = next(x for x in idx["files"] if x["run"] == "old")
    assert (old_e["file"], old_e["current"], old_e["superseded_by"]) == ("archive/2026-12-01/old.json", False, "current/new.json")
    assert idx["figures"]["rank.x"]["file"] == "current/new.json" and idx["figures"]["rank.y"]["gate"] == "failed"
    assert index.problems(idx, root) == []
    again = tmp_path / "incoming" / "new.json"; again.write_text("{}")
    with pytest.raises(FileExistsError, match="already indexed"): index.add(again, "x", index_path=idx_path, root=root)
    with pytest.raises(FileNotFoundError): index.add(tmp_path / "none.json", "x", index_path=idx_path, root=root)


README_ROWS = [   # the README's table, row by row: the figures of the row, the gate word it must show
    (["tp2.decode_bs1_ctx2048"], "passed"), (["rank.decode_bs1_ctx2048"], "passed"),
    (["tp2.decode_bs8.emulation", "tp2.decode_bs32.emulation", "tp2.decode_bs64.emulation"], "passed"),
    (["tp2.decode_bs8.marlin", "tp2.decode_bs32.marlin", "tp2.decode_bs64.marlin"], "failed"),
    (["tp2.decode_bs1_ctx32768"], "failed"), (["tp2.prefill_ctx8192", "tp2.prefill_ctx32768"], "not checked"),
]

def test_the_readme_states_the_current_figures_as_the_index_has_them():
    "Each row of the README's table holds its figures' values and roofline shares as read from current/, and their gate."
    lines = [l for l in _measured_section().splitlines() if l.startswith("| ")]
    assert len(lines) == len(README_ROWS) + 1
    assert {g for n in IDX["figures"] for g in [IDX["figures"][n]["gate"]]} == {"passed", "failed", "unchecked"}
    covered = set()
    for names, word in README_ROWS:
        figs = [index.figure(n) for n in names]
        assert {f["gate"] for f in figs} == {word.replace("not checked", "unchecked")}, names
        values = " / ".join(f"{f['value']['value_tok_s']:,.1f}" for f in figs) + " tok/s"
        shares = " / ".join(f"{100 * f['value']['fraction_of_roofline']:.1f}" for f in figs) + " %"
        row = [l for l in lines if values in l]
        assert len(row) == 1 and shares in row[0] and row[0].rstrip(" |").endswith(word) or word in row[0].split("|")[-2], (names, values, row)
        covered |= set(names)
    assert covered == set(IDX["figures"]) - {"tp2.eager.decode_bs1_ctx2048"}          # every current figure but eager's
    tp2 = index.figure("tp2.decode_bs1_ctx2048")
    med = index.read(tp2["file"])["figure_details"]["decode_bs1_ctx2048"]["itl_median_ms"]
    assert f"({med:.2f} ms a token)" in _measured_section()


def test_no_run_codes_in_chapter_09_or_the_readme():
    "User-facing text names runs by what they are: no variant name of the index (gk3, r6c, ...) in chapter 09 or the README."
    codes = {e["run"] for e in IDX["files"] if e["kind"] == "engine" and re.fullmatch(r"g[a-z]\d*|[ra]\d+[a-z]?", e["run"] or "")}
    assert {"gk3", "r6c", "a0b", "gg"} <= codes
    for where, text in (("09", _sources(ROOT / "nbs" / "09_performance.ipynb")), ("README", (ROOT / "README.md").read_text())):
        found = sorted(c for c in codes if re.search(r"(?<![\w/.-])" + re.escape(c) + r"(?![\w-])", text))
        assert not found, (where, found)


CITED = re.compile(r"(?<![\w/])(benchmarks/[\w./-]+|scripts/[\w./-]+\.py)")

def test_every_cited_benchmark_path_exists():
    "A path under benchmarks/ or scripts/ named by a chapter (not the history), the README or the package exists."
    texts = {nb.relative_to(ROOT / "nbs").as_posix(): _sources(nb) for nb in (ROOT / "nbs").rglob("*.ipynb") if nb.name != HISTORY}
    texts["README.md"] = (ROOT / "README.md").read_text()
    texts |= {p.name: p.read_text() for p in (ROOT / "solar_open2").rglob("*.py")}
    stale = {}
    for name, text in texts.items():
        bad = sorted({m.group(1).rstrip(".,:)`") for m in CITED.finditer(text)} - {"benchmarks/results/incoming/"}
                     - {p for p in {m.group(1).rstrip(".,:)`") for m in CITED.finditer(text)} if (ROOT / p).exists()})
        if bad: stale[name] = bad
    assert not stale, stale
    assert len([n for n in texts if n.startswith("08_")]) >= 15                          # the plugin chapters are among them
