#!/usr/bin/env python
"""Write README.md from nbs/index.ipynb (nbdev_readme needs quarto, which cannot be installed here).

    python scripts/make_readme.py [--check]

Code cells are shown with their outputs; `#| hide` cells and directive lines are dropped. `--check` exits 1 when
README.md differs from what would be written.
"""
import sys
from pathlib import Path
from execnb.nbio import read_nb

ROOT = Path(__file__).resolve().parents[1]

def render(nb_path: Path) -> str:
    out = ["<!-- generated from nbs/index.ipynb by scripts/make_readme.py: edit the notebook, not this file -->", ""]
    for c in read_nb(nb_path).cells:
        src = c.source.rstrip()
        if c.cell_type == "markdown": out += [src, ""]; continue
        if c.cell_type != "code": continue
        lines = src.splitlines()
        if any(l.strip().replace(" ", "") in ("#|hide", "#|eval:false") for l in lines): continue
        code = "\n".join(l for l in lines if not l.lstrip().startswith("#|")).strip()
        if code: out += ["```python", code, "```", ""]
        for o in c.get("outputs", []):
            text = "".join(o.get("text", "")) if o.get("output_type") == "stream" else "".join(o.get("data", {}).get("text/plain", ""))
            if text.strip(): out += ["```", text.rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"

def main():
    text, dest = render(ROOT/"nbs"/"index.ipynb"), ROOT/"README.md"
    if "--check" in sys.argv:
        if not dest.exists() or dest.read_text() != text: sys.exit("README.md is out of date: run `python scripts/make_readme.py`")
        return
    dest.write_text(text); print(f"wrote {dest}")

if __name__ == "__main__": main()
