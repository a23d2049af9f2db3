#!/usr/bin/env python
"""Execute notebooks in place so their outputs (the numbers each chapter reports) are committed, then clean them.

    python scripts/execute_nbs.py [NOTEBOOK ...] [--flags gpu slow]

Cells tagged with a flag of settings.ini's `tst_flags` are skipped unless named in `--flags` (so a CPU run keeps the
outputs a GPU run left in `#| gpu` cells); `#| eval: false` cells are never run. Stops at the first failing cell and
leaves that notebook untouched.
"""
import argparse, configparser, os, subprocess, sys
from pathlib import Path

from execnb.nbio import read_nb, write_nb, NbCell
from execnb.shell import CaptureShell
from nbdev.process import extract_directives

ROOT = Path(__file__).resolve().parents[1]

def run(nb_path: Path, skip: set) -> bool:
    nb = read_nb(nb_path)
    def no_eval(cell):
        if cell.cell_type != "code": return True
        d = extract_directives(NbCell(0, dict(cell_type="code", source=cell.source)), remove=False)
        if d.get("eval:", [""])[0].lower() == "false": return True
        return bool(skip & d.keys())
    sh = CaptureShell(nb_path)
    cwd = os.getcwd(); os.chdir(nb_path.parent)
    try: sh.run_all(nb, exc_stop=True, preproc=no_eval)
    except Exception as e:
        if sh.exc is None: raise
        sys.stderr.write(sh.prettytb(fname=nb_path) + "\n"); return False
    finally: os.chdir(cwd)
    write_nb(nb, nb_path)
    return True

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="default: every nbs/*.ipynb")
    ap.add_argument("--flags", nargs="*", default=[], help="tst_flags to run anyway (e.g. gpu)")
    a = ap.parse_args()
    cfg = configparser.ConfigParser(delimiters=["="]); cfg.read(ROOT/"settings.ini")
    skip = set(cfg["DEFAULT"]["tst_flags"].split()) - set(a.flags)
    nbs = [Path(p).resolve() for p in a.notebooks] or sorted((ROOT/"nbs").glob("*.ipynb"))
    sys.path.insert(0, str(ROOT))
    bad = [p.name for p in nbs if not run(p, skip)]
    subprocess.run([str(Path(sys.executable).parent/"nbdev_clean")], cwd=ROOT, check=True)
    if bad: sys.exit(f"failed: {', '.join(bad)}")
    print(f"executed {len(nbs)} notebook(s)")

if __name__ == "__main__": main()
