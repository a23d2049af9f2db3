#!/usr/bin/env python
"""Write README.md from nbs/index.ipynb (nbdev_readme needs quarto, which cannot be installed here).

    python scripts/make_readme.py [--check]

Code cells are shown with their outputs; `#| hide` cells and directive lines are dropped. `--check` exits 1 when
README.md differs from what would be written.

The docs site (scripts/build_docs.py) renders the same notebook as its landing page, where chapter links such as
`config.html` are pages of the site. README.md lives at the repository root, where no such page exists, so those
links point to the chapter notebooks instead (`nbs/00_config.ipynb`), with the page names computed by the docs
build's own function: the two agree by construction.
"""
import re, sys
from pathlib import Path
from execnb.nbio import read_nb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"scripts"))
from build_docs import list_notebooks, page_name  # noqa: E402

def relink(md: str, nbs: Path) -> str:
    "Site-relative chapter links `(page.html#frag)` -> `(nbs/NN_page.ipynb#frag)`; other links unchanged."
    pages = {page_name(p) + ".html": "nbs/" + p.as_posix() for p in list_notebooks(nbs)}
    def sub(m):
        path, frag = m.group(2), m.group(3) or ""
        return f"{m.group(1)}{pages[path]}{frag})" if path in pages else m.group(0)
    return re.sub(r"(\]\()([\w./-]+\.html)(#[^)\s]*)?\)", sub, md)

def render(nb_path: Path) -> str:
    out = ["<!-- generated from nbs/index.ipynb by scripts/make_readme.py: edit the notebook, not this file -->", ""]
    for c in read_nb(nb_path).cells:
        src = c.source.rstrip()
        if c.cell_type == "markdown": out += [relink(src, nb_path.parent), ""]; continue
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
