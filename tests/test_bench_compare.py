"""`benchmarks.engine.compare` without a GPU: staging an older commit's code, each layout's command lines, a run in a
tree of its own (a stand-in tree whose benchmark only writes a file), and the verdict on two run directories."""
import json, subprocess, sys
from pathlib import Path

import pytest

from benchmarks.engine import compare as cmp

ROOT = Path(__file__).resolve().parents[1]
OLD = "bfd3b63"          # the last commit before the benchmarks became a package


def test_stage_writes_the_code_of_an_older_commit_and_no_results(tmp_path):
    if subprocess.run(["git", "cat-file", "-e", f"{OLD}^{{commit}}"], cwd=ROOT).returncode:
        pytest.skip(f"the history does not hold {OLD} (a shallow clone)")
    dest = tmp_path / "old"
    paths = cmp.stage(OLD, dest)
    assert paths == list(cmp.STAGED) and (dest / "STAGED_FROM").read_text() == f"{OLD}\n"
    assert cmp.layout(dest) == "scripts" and cmp.layout(ROOT) == "package"
    assert not list(dest.rglob("results")) and (dest / "solar_open2" / "vllm" / "__init__.py").exists()
    assert sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) < 8 * 2**20    # travels with the tree
    with pytest.raises(FileExistsError): cmp.stage(OLD, dest)
    with pytest.raises(ValueError, match="commit"): cmp.stage("0" * 40, tmp_path / "x")


def test_each_layout_gets_its_own_command(tmp_path):
    (tmp_path / "benchmarks").mkdir(); (tmp_path / "scripts").mkdir()
    (tmp_path / "benchmarks" / "perf_h200.py").write_text(""); (tmp_path / "scripts" / "gpu_parity.py").write_text("")
    old_p = cmp.run_command(tmp_path, "parity", Path("/o"), 500, python="py")
    old_r = cmp.run_command(tmp_path, "rank", Path("/o"), 500, python="py")
    new_p = cmp.run_command(ROOT, "parity", Path("/o"), 500, python="py")
    new_r = cmp.run_command(ROOT, "rank", Path("/o"), 500, python="py")
    assert old_p[:2] == ["py", "scripts/gpu_parity.py"] and new_p[:3] == ["py", "-m", "benchmarks.engine.parity"]
    assert old_r[:2] == ["py", "benchmarks/perf_h200.py"] and new_r[:3] == ["py", "-m", "benchmarks.engine.perf"]
    assert old_p[2:-6] == new_p[3:-6] and old_r[2:-6] == new_r[3:-6]                    # the same run on both trees
    assert old_p[old_p.index("--name") + 1] == "gpu_parity_compare_scripts" and new_p[new_p.index("--name") + 1] == "gpu_parity_compare_package"
    assert "--moe-backend" in new_r and new_r[new_r.index("--config") + 1] == "rank" and new_r[new_r.index("--variant") + 1] == "compare_package"
    with pytest.raises(ValueError, match="neither layout"): cmp.layout(tmp_path / "nothing")
    with pytest.raises(ValueError, match="--what"): cmp.run_command(ROOT, "prefill", Path("/o"), 1)
    old_src = subprocess.run(["git", "show", f"{OLD}:benchmarks/perf_h200.py"], cwd=ROOT, capture_output=True, text=True).stdout
    if old_src:                                                                         # the old harness knows every flag given
        assert all(f'"{flag}"' in old_src for flag in old_r[2:-6:2] + ["--variant", "--out", "--deadline-s"]), old_r


def test_a_run_happens_in_its_tree(tmp_path):
    "The child runs with the tree as working directory and first on PYTHONPATH: a stand-in tree's package is the one run."
    tree = tmp_path / "tree"
    pkg = tree / "benchmarks" / "engine" / "perf"; pkg.mkdir(parents=True)
    for d in (tree / "benchmarks", tree / "benchmarks" / "engine", pkg): (d / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("import os, sys, pathlib\nout = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
                                     "(out / 'ran.txt').write_text(os.getcwd() + '\\n' + pathlib.Path(__file__).resolve().as_posix())\n")
    rc = cmp.run(tree, "rank", tmp_path / "out", deadline_s=60)
    cwd, main = (tmp_path / "out" / "ran.txt").read_text().splitlines()
    rec = json.loads((tmp_path / "out" / "rank_compare_run.json").read_text())
    assert rc == 0 and Path(cwd) == tree and main == (pkg / "__main__.py").resolve().as_posix()
    assert (rec["layout"], rec["returncode"], rec["command"][1:3]) == ("package", 0, ["-m", "benchmarks.engine.perf"])
    r = subprocess.run([sys.executable, "-m", "benchmarks.engine.compare", "run", "--tree", str(tree), "--what", "rank,parity",
                        "--out", str(tmp_path / "both"), "--deadline-s", "60"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and (tmp_path / "both" / "ran.txt").exists()                 # rank ran; parity (no module) failed
    assert [json.loads((tmp_path / "both" / f"{w}_compare_run.json").read_text())["returncode"] for w in ("rank", "parity")] == [0, 1]


def _dirs(tmp_path, tokens_new=None, median_new=5.0, degenerate_new=False):
    for name, tok, med, deg in (("old", [[1, 2, 3]], 5.0, False), ("new", tokens_new or [[1, 2, 3]], median_new, degenerate_new)):
        d = tmp_path / name; d.mkdir(parents=True)
        (d / f"gpu_parity_compare_{name}.json").write_text(json.dumps({"passed": True, "failures": [], "runs": {
            cmp.PARITY_CASE: {"tokens": tok, "batched_equals_single": [True]}}}))
        (d / f"perf_h200_rank_graphs_compare_{name}.json").write_text(json.dumps({
            "phase": "graphs", "figures": {cmp.FIGURE: {"value_tok_s": 1e3 / med}}, "figure_details": {cmp.FIGURE: {"itl_median_ms": med}},
            "sanity": {cmp.FIGURE: {"degenerate": deg, "passed": not deg}}}))
    return tmp_path / "old", tmp_path / "new"

def test_report_agrees_and_names_each_disagreement(tmp_path):
    v = cmp.report(*_dirs(tmp_path / "a", median_new=5.08))
    assert v["agree"] and v["problems"] == [] and abs(v["rank"]["new_over_old"] - 1.016) < 1e-9
    v = cmp.report(*_dirs(tmp_path / "b", tokens_new=[[1, 2, 4]], median_new=5.2, degenerate_new=True))
    assert not v["agree"] and len(v["problems"]) == 3
    assert v["problems"][0].startswith("parity: tokens differ") and "beyond 2%" in v["problems"][1] and "sanity gate" in v["problems"][2]
    (tmp_path / "empty").mkdir()
    assert cmp.report(tmp_path / "b" / "old", tmp_path / "empty")["problems"][0].startswith("parity: no gpu_parity_compare_*.json")
    r = subprocess.run([sys.executable, "-m", "benchmarks.engine.compare", "report", str(tmp_path / "a" / "old"), str(tmp_path / "a" / "new"),
                        "--out", str(tmp_path / "v.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and json.loads((tmp_path / "v.json").read_text())["agree"] is True
    r = subprocess.run([sys.executable, "-m", "benchmarks.engine.compare", "report", str(tmp_path / "b" / "old"), str(tmp_path / "b" / "new")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
