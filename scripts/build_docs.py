#!/usr/bin/env python
"""Render every notebook in nbs/ into a static HTML site (`nbdev_docs` needs quarto, which cannot be installed here).

    python scripts/build_docs.py [--site docs] [--build build/docs] [--nbs nbs] [--add NB ...] [--quiet]

1. nbdev's notebook processors (the pipeline `nbdev_proc_nbs` runs, `FilterDefaults`) write `BUILD/_proc/*.ipynb`:
   the title cell becomes frontmatter, exported symbols get `show_doc` API tables, directives are applied and
   `#| hide` cells are dropped. One change: exported cells keep their code (nbdev's `rm_export` would drop it; in a
   literate port the code is the point). Two: nbdev executes every cell that contains an import, so a test cell
   that imports would rerun its test during the build (08f's Triton-interpreted checks took 213 s of a 256 s build);
   here a cell that imports *and* runs other code is not executed, and the page shows its stored outputs. Exported
   cells, import-only cells and `show_doc` cells run as in nbdev. `nbdev_clean` then normalises the processed
   notebooks.
2. Each processed notebook becomes one markdown page named as nbdev names it (number prefix dropped:
   `00_config.ipynb` -> `config.html`): markdown cells as written, with `$...$` and `$$...$$` turned into MathML at
   build time (latex2mathml: renders offline, no MathJax CDN), code cells as highlighted blocks (exported ones
   titled with their module file) followed by their outputs; nbdev's doc links become relative links.
3. mkdocs + mkdocs-material render `BUILD/pages` into SITE with the chapters in reading order in the sidebar: index
   first, then the numbered notebooks by name. The generated `BUILD/mkdocs.yml` can be rebuilt alone with
   `mkdocs build -f BUILD/mkdocs.yml`.

The build is offline and deterministic (fixed file names, sorted inputs, `SOURCE_DATE_EPOCH` pinned).
"""
from __future__ import annotations
import argparse, base64, hashlib, html, importlib, inspect, json, os, posixpath, re, shutil, subprocess, sys, time, warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPORT_MARK = "docs-exported-to"  # directive the processing step adds to exported cells: module name or "-"

# ---------------------------------------------------------------------------------------------------------------
# 1. nbdev processing
# ---------------------------------------------------------------------------------------------------------------

def page_name(nb_rel: Path) -> str:
    "nbdev's page name for a notebook path relative to nbs/, without suffix: `00_config.ipynb` -> `config`."
    from nbdev.doclinks import _nbpath2html
    return _nbpath2html(nb_rel).with_suffix("").as_posix()

def list_notebooks(nbs: Path) -> list[Path]:
    "Notebooks under `nbs` in reading order: index first, then by path (numbered chapters sort by number)."
    from nbdev.doclinks import nbglob
    files = sorted(Path(f).relative_to(nbs) for f in nbglob(nbs, func=os.path.join, file_glob="*.ipynb"))
    return sorted(files, key=lambda p: (p.as_posix() != "index.ipynb", p.as_posix()))

SHOW_DIRECTIVES = {"export", "exports", "exporti", "exec_doc"}  # cells nbdev always executes for show_doc

def is_test_cell_with_imports(cell) -> bool:
    """True for a code cell nbdev would execute only because it imports, while it also runs other code (a test).
    Exported and `exec_doc` cells, import-only cells and cells that call `show_doc` are not test cells."""
    import ast
    from nbdev.processors import _ast_contains, _show_docs
    if cell.get("cell_type") != "code" or not cell.get("source"): return False
    if cell.directives_.keys() & SHOW_DIRECTIVES: return False
    trees = cell.parsed_()  # top-level statements; None when the source does not parse (magics)
    if not trees or not _ast_contains(trees, (ast.Import, ast.ImportFrom)): return False
    if all(isinstance(t, (ast.Import, ast.ImportFrom)) for t in trees): return False
    return not _show_docs(trees)

def docs_filter():
    "nbdev's `FilterDefaults` (the processors `nbdev_proc_nbs` runs) with the changes this site needs."
    from nbdev.process import Processor
    from nbdev.processors import FilterDefaults, add_show_docs, exec_show_docs, rm_export

    def rm_hidden(cell):
        "nbdev's `rm_export` without `export`/`exporti`: drop `#| hide` and `#| default_exp` cells only."
        if cell.directives_ and (cell.directives_.keys() & {"hide", "default_exp"}): del cell["source"]

    def mark_export(cell):
        "Keep the export target visible to the page renderer (nbdev strips directive lines from the source)."
        if cell.cell_type != "code" or not cell.directives_: return
        k = next((k for k in ("export", "exports", "exporti") if k in cell.directives_), None)
        if k: cell.source = f"#| {EXPORT_MARK}: {' '.join(cell.directives_[k]) or '-'}\n" + cell.source

    class order_show_docs(Processor):
        "`add_show_docs` inserts a cell's show_doc cells one by one at the same index, reversing them: restore order."
        def begin(self):
            cells, i = self.nb.cells, 0
            while i < len(cells):
                j = i
                while j < len(cells) and getattr(cells[j], "has_sd", False): j += 1
                if j > i: cells[i:j] = cells[i:j][::-1]
                i = max(j, i + 1)

    class exec_doc_cells(exec_show_docs):
        """nbdev's `exec_show_docs` minus test cells: a cell that imports and also runs other code is not executed.
        The ipywidgets state nbdev saves into the notebook keeps every value, defaults too (the page draws it)."""
        def __call__(self, cell):
            if is_test_cell_with_imports(cell): return
            super().__call__(cell)
        def end(self):
            try: from ipywidgets import Widget
            except ImportError: return
            mime = "application/vnd.jupyter.widget-state+json"
            self.nb.metadata["widgets"] = {mime: Widget.get_manager_state(drop_defaults=False)}

    class DocsFilter(FilterDefaults):
        def base_procs(self):
            procs = []
            for p in super().base_procs():
                procs.append({rm_export: rm_hidden, exec_show_docs: exec_doc_cells}.get(p, p))
                if p is add_show_docs: procs.append(order_show_docs)
            return procs + [mark_export]
    return DocsFilter

def process_notebook(src: Path, dst: Path, rel: Path, filt) -> str | None:
    "One notebook through the processors into `dst`, then `nbdev_clean`; returns its `default_exp` module."
    from execnb.nbio import read_nb, write_nb
    from nbdev.clean import nbdev_clean
    from nbdev.processors import _default_exp
    from nbdev.config import get_config
    nb = read_nb(src)
    module, known = _default_exp(nb), {c.get("id") for c in nb.cells}
    lib = Path(str(get_config().lib_path)).name
    _CURRENT["module"] = f"{lib}.{module}" if module else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Found cells containing imports")
        try: filt()(nb)
        except Exception as e: raise SystemExit(f"build_docs: nbdev could not process {src}: {e}") from e
    for i, c in enumerate(nb.cells):  # cells nbdev inserted (frontmatter, show_doc) get random ids: fix them
        if c.get("id") is None or c.get("id") not in known:
            c["id"] = hashlib.sha1(f"{rel.as_posix()}:{i}:{c.get('source', '')}".encode()).hexdigest()[:8]
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_nb(nb, dst)
    nbdev_clean(fname=str(dst))
    return module

def process_notebooks(sources: dict, proc: Path) -> dict:
    "Run the processors on each notebook into `proc`; returns {rel_path: default_exp module or None}."
    os.environ.setdefault("IN_TEST", "1")  # what nbdev's own docs driver sets while it executes show_doc cells
    import nbdev.showdoc as showdoc
    if proc.exists(): shutil.rmtree(proc)
    filt, default_renderer = docs_filter(), showdoc.BasicMarkdownRenderer
    showdoc.BasicMarkdownRenderer = table_renderer(default_renderer)  # show_doc's default, for this build only
    try: return {rel: process_notebook(src, proc/rel, rel, filt) for rel, src in sources.items()}
    finally: showdoc.BasicMarkdownRenderer = default_renderer

def _md_cell(v) -> str:
    "A table cell: code spans kept, pipes outside them escaped, HTML-ish text (`<factory>`) escaped."
    if v is inspect.Parameter.empty: return ""
    if isinstance(v, type): v = v.__name__
    parts = re.split(r"(`[^`]*`)", str(v).replace("\n", " "))
    return "".join(p if p.startswith("`") else html.escape(p, quote=False).replace("|", "\\|") for p in parts)

def param_table(sym) -> str:
    """The parameter table of `sym` from its docments (fastcore's `DocmentTbl` data, escaped for markdown tables):
    name, type, default, details, and the return row; '' when no parameter is documented."""
    from fastcore.docments import DocmentTbl
    try: t = DocmentTbl(sym)
    except Exception: return ""
    if not t.has_docment: return ""
    cols = [c for c in ("anno", "default", "docment") if c in t._columns]
    names = {"anno": "Type", "default": "Default", "docment": "Details"}
    fmt = _md_cell
    rows = ["| | " + " | ".join(f"**{names[c]}**" for c in cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for p in t.params:
        if p == "self" or p not in t.dm: continue
        rows.append(f"| `{p}` | " + " | ".join(fmt(t.dm[p].get(c)) for c in cols) + " |")
    if t.has_return: rows.append("| **Returns** | " + " | ".join(fmt(t.dm["return"].get(c)) for c in cols) + " |")
    return "\n".join(rows)

_CURRENT = {"module": None}  # the `default_exp` module of the notebook being processed, e.g. "solar_open2.config"

def library_sym(sym):
    """The exported object `sym` is a copy of. show_doc runs on objects the processing shell defined; the source of
    a class defined there cannot be read back (so no docments), while the exported module's can."""
    mod = _CURRENT["module"]
    if not mod or isinstance(sym, str): return sym
    try:
        obj = importlib.import_module(mod)
        for part in getattr(sym, "__qualname__", "").split("."): obj = getattr(obj, part)
        return obj
    except Exception: return sym

def table_renderer(base):
    "nbdev's show_doc markdown (signature, docstring) followed by the parameter table, as nbdev's site shows it."
    class TableMarkdownRenderer(base):
        def _repr_markdown_(self):
            md, tbl = super()._repr_markdown_(), param_table(self.sym) or param_table(library_sym(self.sym))
            return f"{md}\n\n{tbl}" if tbl else md
    return TableMarkdownRenderer

# ---------------------------------------------------------------------------------------------------------------
# 2. notebook -> markdown page
# ---------------------------------------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"^(\s*)(`{3,}|~{3,})")
_CODESPAN_RE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
# pandoc's tex_math_dollars: `$$...$$`; `$x$` needs a non-space after the opening and before the closing dollar,
# and no digit right after the closing one (so "$5 and $6" stays text)
_DISPLAY_RE = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$", re.DOTALL)
_INLINE_RE = re.compile(r"(?<![\\$])\$(?![\s$])((?:[^$\\\n]|\\.|\n(?!\s*\n))+?)(?<![\s\\])\$(?![\d$])")
_LIST_RE = re.compile(r"^(\s*)([-*+]|\d+\.)(\s+)\S")
_MD_SPECIAL = re.compile(r"&#?[0-9A-Za-z]+;|[\\`*_{}\[\]|$~^]")  # markdown syntax chars (entities kept)

def _stash(text: str, pattern: re.Pattern, store: list) -> str:
    def keep(m):
        store.append(m.group(0)); return f"\x00{len(store)-1}\x00"
    return pattern.sub(keep, text)

def _unstash(text: str, store: list) -> str:
    return re.sub(r"\x00(\d+)\x00", lambda m: store[int(m.group(1))], text)

class Warnings(list):
    def add(self, where, msg): self.append(f"{where}: {msg}")

def tex_to_mathml(tex: str, display: bool, where: str = "", warn: Warnings | None = None) -> str:
    "One TeX formula as MathML whose text is entity-escaped, so Python-Markdown leaves it alone."
    from latex2mathml.converter import convert
    try: out = convert(tex.strip(), display="block" if display else "inline")
    except Exception as e:
        if warn is not None: warn.add(where, f"cannot convert TeX {tex!r} ({type(e).__name__}: {e}); shown as code")
        return f'<code class="nb-math-error">{html.escape(tex)}</code>'
    unknown = re.findall(r"<m[io][^>]*>(\\[A-Za-z]+)</m[io]>", out)
    if unknown and warn is not None: warn.add(where, f"unknown TeX command(s) {sorted(set(unknown))} in {tex!r}")
    esc = lambda m: m.group(0) if len(m.group(0)) > 1 else f"&#{ord(m.group(0))};"
    out = re.sub(r">([^<]+)<", lambda m: ">" + _MD_SPECIAL.sub(esc, m.group(1)) + "<", out)
    return out

def convert_math(text: str, where: str = "", warn: Warnings | None = None) -> str:
    "Replace `$$...$$` and `$...$` outside code spans by MathML; `\\$` becomes a literal dollar."
    spans: list = []
    text = _stash(text, _CODESPAN_RE, spans)
    text = _DISPLAY_RE.sub(lambda m: tex_to_mathml(m.group(1), True, where, warn), text)
    text = _INLINE_RE.sub(lambda m: tex_to_mathml(m.group(1), False, where, warn), text)
    text = text.replace("\\$", "&#36;")
    return _unstash(text, spans)

def normalize_markdown(src: str, where: str = "", warn: Warnings | None = None) -> str:
    """Notebook (GFM-like) markdown -> Python-Markdown: math to MathML, a blank line before a list or table that
    follows a paragraph line, nested list items re-indented to 4 spaces per level. Fenced code is left as is."""
    out, para, fence, stack, prev_blank = [], [], None, [], True
    def flush():
        if para: out.extend(convert_math("\n".join(para), where, warn).split("\n")); para.clear()
    for line in src.split("\n"):
        m = _FENCE_RE.match(line)
        if fence is not None:  # inside fenced code: copy, re-indented with its list item
            out.append(" " * fence[1] + line[fence[2]:] if line[:fence[2]].strip() == "" else line)
            if m and m.group(2)[0] == fence[0][0] and len(m.group(2)) >= len(fence[0]) and not line[m.end():].strip():
                fence = None
            prev_blank = False; continue
        if m:
            flush()
            ind = len(m.group(1)); new = 4*len(stack) if stack and ind > 0 else ind
            if out and out[-1].strip(): out.append("")
            out.append(" " * new + line[ind:]); fence = (m.group(2), new, ind); prev_blank = False; continue
        if not line.strip():
            flush(); out.append(line); prev_blank = True; continue
        lm = _LIST_RE.match(line)
        ind = len(line) - len(line.lstrip())
        if lm:
            ind = len(lm.group(1))
            in_list = bool(stack)
            while stack and ind < stack[-1]: stack.pop()
            if not in_list and not prev_blank and (para or (out and out[-1].strip())):
                starts_list = lm.group(2) in "-*+" or lm.group(2) == "1."
                if starts_list: flush(); out.append("")
            if stack or prev_blank or not para or lm.group(2) in "-*+" or lm.group(2) == "1.":
                flush()
                new = 4*len(stack)
                stack.append(ind + len(lm.group(2)) + len(lm.group(3)))
                para.append(" " * new + line[ind:])
                prev_blank = False; continue
        elif stack:
            if ind == 0 and prev_blank: stack = []
            elif ind > 0: line = " " * (4*len(stack)) + line.lstrip()
        if line.lstrip().startswith("|") and para and not para[-1].lstrip().startswith("|") and not stack:
            flush(); out.append("")
        para.append(line); prev_blank = False
    flush()
    return "\n".join(out)

_DIRECTIVE_RE = re.compile(r"^\s*#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$")

def split_directives(src: str) -> tuple[dict, str]:
    "Leading `#| key: value` lines -> ({key: value}, rest of the source)."
    d, lines = {}, src.split("\n")
    while lines and (m := _DIRECTIVE_RE.match(lines[0])):
        d[m.group(1)] = m.group(2).strip().strip('"').strip("'") or True; lines.pop(0)
    return d, "\n".join(lines).strip("\n")

def _falsy(v) -> bool: return str(v).lower() in ("false", "no", "0")
def _text(v) -> str: return "".join(v) if isinstance(v, list) else str(v)
_ANSI_RE = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")

import yaml  # noqa: E402  (PyYAML: a dependency of mkdocs and nbdev)

# ---------------------------------------------------------------------------------------------------------------
# ipywidgets outputs: a static picture of the panel in the state the docs build left it
# ---------------------------------------------------------------------------------------------------------------

WIDGET_VIEW, WIDGET_STATE = "application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json"
WIDGET_NOTE = ("A static view of this panel as the notebook leaves it; in Jupyter its controls are live and "
               "the output follows them.")

def widget_html(model_id: str, state: dict, depth: int = 0) -> str:
    """One widget model of a saved ipywidgets state as static HTML: boxes hold their children, sliders and toggle
    buttons show their value (disabled controls), HTML and Label widgets show their text."""
    m = state.get(model_id)
    if m is None or depth > 20: return ""
    name, st = m.get("model_name", ""), m.get("state", {})
    esc = lambda v: html.escape(str(v))
    desc = f'<span class="nb-widget-label">{esc(st.get("description", ""))}</span>' if st.get("description") else ""
    if name.endswith("BoxModel") or name in ("AccordionModel", "TabModel", "StackModel"):
        kids = "".join(widget_html(c.removeprefix("IPY_MODEL_"), state, depth + 1) for c in st.get("children", []))
        tag = "nb-widget-row" if name == "HBoxModel" else "nb-widget-box"
        return f'<div class="{tag}">{kids}</div>'
    if name in ("HTMLModel", "HTMLMathModel"): return f'<div class="nb-widget-html">{desc}{st.get("value", "")}</div>'
    if name == "LabelModel": return f'<div class="nb-widget-html">{desc}{esc(st.get("value", ""))}</div>'
    labels = st.get("_options_labels")
    if name in ("ToggleButtonsModel", "RadioButtonsModel") and labels is not None:
        idx = st.get("index")
        on = ' class="nb-widget-on"'
        btns = "".join(f'<button disabled{on if i == idx else ""}>{esc(l)}</button>' for i, l in enumerate(labels))
        return f'<div class="nb-widget-row">{desc}<span class="nb-widget-buttons">{btns}</span></div>'
    if labels is not None and "index" in st:  # SelectionSlider, Dropdown, Select...
        idx = st["index"] if isinstance(st["index"], int) else 0
        value = labels[idx] if 0 <= idx < len(labels) else ""
        bar = f'<input type="range" min="0" max="{max(len(labels) - 1, 0)}" value="{idx}" disabled>'
        return f'<div class="nb-widget-row">{desc}{bar}<span class="nb-widget-value">{esc(value)}</span></div>'
    if "value" in st and "min" in st and "max" in st:  # Int/Float sliders and their kin
        v = st["value"]
        bar = f'<input type="range" min="{esc(st["min"])}" max="{esc(st["max"])}" step="{esc(st.get("step", 1))}" value="{esc(v)}" disabled>'
        shown = f"{v:g}" if isinstance(v, float) else esc(v)
        return f'<div class="nb-widget-row">{desc}{bar}<span class="nb-widget-value">{shown}</span></div>'
    if "value" in st:
        return f'<div class="nb-widget-row">{desc}<span class="nb-widget-value">{esc(st["value"])}</span></div>'
    return f'<div class="nb-widget-row">{desc}<code>{esc(name.removesuffix("Model"))}</code></div>'

def widget_panel(model_id: str, state: dict) -> str:
    "A widget output: its static view in a frame, with a note that it is live in Jupyter."
    return (f'<div class="nb-output nb-widget"><div class="nb-widget-note">{html.escape(WIDGET_NOTE)}</div>\n'
            f'{widget_html(model_id, state)}\n</div>')

# nbdev's show_doc "source" link to `{git_url}/blob/...`, floated right: `[source](url){target=... style=...}`
# (nbdev 2) or `<a href="url" ...>source</a>`
_SOURCE_LINK_RE = re.compile(r'\[source\]\([^)\s]*\)(\{[^}\n]*\})?\s*|<a href="[^"]*"[^>]*>source</a>\s*')

class Page:
    "One processed notebook rendered to a markdown page (`render`), plus the files its outputs need (`assets`)."
    def __init__(self, rel: Path, src: Path, nb: dict, module: str | None, ctx: dict):
        self.rel, self.src, self.nb, self.module, self.ctx = rel, src, nb, module, ctx
        self.name = ctx["names"][rel]  # e.g. "config" or "sub/thing"
        self.assets: dict[str, bytes] = {}
        self.fm: dict = {}

    # links --------------------------------------------------------------------------------------------------
    def relink(self, text: str) -> str:
        "nbdev's absolute doc links (`{doc_host}{doc_baseurl}/x.html#a`) and relative `x.html` page links -> `x.md`."
        base, here = self.ctx["doc_url"], posixpath.dirname(self.name)
        def page_target(path):  # "config.html" relative to this page -> "config.md" when it is a page
            target = posixpath.normpath(posixpath.join(here, path))
            stem = target[:-5] if target.endswith(".html") else None
            if stem in self.ctx["pages"]: return posixpath.relpath(stem + ".md", here or ".")
            return None
        def sub(m):
            url = m.group(2)
            frag = ""
            if "#" in url: url, frag = url.split("#", 1); frag = "#" + frag
            if base and url.startswith(base):
                path = url[len(base):].lstrip("/") or "index.html"
                t = page_target(posixpath.relpath(path, here or "."))
            elif not re.match(r"^[a-z][a-z0-9+.-]*:|^/", url) and url.endswith(".html"):
                t = page_target(url)
            else: return m.group(0)
            return m.group(1) + (t + frag if t else m.group(2)) + m.group(3)
        return re.sub(r"(\]\()([^)\s]+)(\)|\s)", sub, text)

    # cells --------------------------------------------------------------------------------------------------
    def where(self, i):
        "Names a cell for warnings by its first line (processing shifts indices; ids are invisible in Jupyter)."
        cells = self.nb["cells"]
        first = _text(cells[i].get("source", "")).strip().split("\n")[0][:50] if i < len(cells) else ""
        return f"{self.ctx['nbs_label']}/{self.rel.as_posix()}, cell starting {first!r}"

    def markdown_cell(self, i, cell) -> str:
        src = _text(cell.get("source", ""))
        for name, data in (cell.get("attachments") or {}).items():  # pasted images
            for mime, b64 in data.items():
                ext = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/svg+xml": "svg"}.get(mime)
                if not ext: continue
                fn = f"{posixpath.basename(self.name)}_files/attachment-{i}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"
                if not fn.endswith("." + ext): fn += "." + ext
                self.assets[fn] = b64.encode() if ext == "svg" else base64.b64decode(_text(b64))
                src = src.replace(f"attachment:{name}", fn)
                break
        return self.local_files(self.md(src, i))

    _LOCAL_REF_RE = re.compile(r"""(!\[[^\]]*\]\(|<img\s[^>]*?src=["'])([^)"'\s]+)""")

    def local_files(self, md: str) -> str:
        "Images the markdown takes from outside nbs/ (`../benchmarks/results/x.png`) are copied into the site."
        def sub(m):
            ref = m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:|^/|^#", ref): return m.group(0)
            f = (self.src.parent/ref).resolve()
            if not f.is_file() or f.is_relative_to(self.ctx["nbs"]): return m.group(0)
            key = f.relative_to(ROOT).as_posix() if f.is_relative_to(ROOT) else \
                hashlib.sha1(str(f).encode()).hexdigest()[:10] + "/" + f.name
            self.ctx["ext_files"][f"ext/{key}"] = f
            return m.group(1) + posixpath.relpath(f"ext/{key}", posixpath.dirname(self.name) or ".")
        return self._LOCAL_REF_RE.sub(sub, md)

    def code_cell(self, i, cell) -> str:
        d, src = split_directives(_text(cell.get("source", "")))
        if _falsy(d.get("include", True)): return ""
        parts = []
        if src.strip() and not _falsy(d.get("echo", True)):
            lang = (cell.get("metadata") or {}).get("language") or self.ctx["lang"]
            attrs = ""
            if EXPORT_MARK in d:
                mod = d[EXPORT_MARK] if d[EXPORT_MARK] not in ("-", True) else self.module
                if mod: attrs = f' title="{self.ctx["lib_path"]}/{mod.replace(".", "/")}.py"'
            fence = "`" * max(3, max((len(r) for r in re.findall(r"`{3,}", src)), default=0) + 1)
            block = f"{fence}{lang}{attrs}\n{src}\n{fence}"
            fold = d.get("code-fold")
            if fold and not _falsy(fold):
                summary = d.get("code-summary", "Code")
                block = f'???{"+" if fold == "show" else ""} source "{summary}"\n' + "\n".join("    " + l for l in block.split("\n"))
            parts.append(block)
        if not _falsy(d.get("output", True)) or d.get("output") == "asis":
            for j, o in enumerate(cell.get("outputs", [])): parts.append(self.output(i, j, o, d.get("output") == "asis"))
        return "\n\n".join(p for p in parts if p)

    def output(self, i, j, o, asis) -> str:
        kind = o.get("output_type")
        if kind == "stream":
            txt = _ANSI_RE.sub("", _text(o.get("text", "")))
            if asis and o.get("name") == "stdout": return self.md(txt, i)  # `#| output: asis`: printed markdown
            return self.pre(txt, "nb-stderr" if o.get("name") == "stderr" else "")
        if kind == "error":
            return self.pre(_ANSI_RE.sub("", "\n".join(o.get("traceback", [])) or f"{o.get('ename')}: {o.get('evalue')}"), "nb-error")
        data = o.get("data", {})
        if WIDGET_VIEW in data:
            view = data[WIDGET_VIEW]
            view = json.loads(_text(view)) if not isinstance(view, dict) else view
            state = ((self.nb.get("metadata") or {}).get("widgets") or {}).get(WIDGET_STATE, {}).get("state", {})
            if view.get("model_id") in state: return widget_panel(view["model_id"], state)
        if "text/markdown" in data:
            md = _text(data["text/markdown"])
            if md.lstrip().startswith("---\n"): return self.show_doc(md, i)  # nbdev's show_doc output
            return self.md(md, i) if asis else f'<div class="nb-output nb-markdown" markdown="1">\n\n{self.md(md, i)}\n\n</div>'
        if "text/html" in data:
            return f'<div class="nb-output nb-html">\n{_text(data["text/html"]).strip()}\n</div>'
        for mime, ext in (("image/svg+xml", "svg"), ("image/png", "png"), ("image/jpeg", "jpg"), ("image/gif", "gif")):
            if mime in data:
                fn = f"{posixpath.basename(self.name)}_files/cell{i}-out{j}.{ext}"
                raw = _text(data[mime])
                self.assets[fn] = raw.encode() if ext == "svg" else base64.b64decode(raw)
                return f'<div class="nb-output nb-image"><img src="{fn}" alt="output of cell {i}"></div>'
        if "text/latex" in data:
            tex = _text(data["text/latex"]).strip().strip("$")
            return f'<div class="nb-output nb-math">{tex_to_mathml(tex, True, self.where(i), self.ctx["warn"])}</div>'
        if "text/plain" in data: return self.pre(_text(data["text/plain"]), "nb-result")
        return ""

    def md(self, md: str, i) -> str: return self.relink(normalize_markdown(md, self.where(i), self.ctx["warn"]))

    @staticmethod
    def pre(txt: str, cls: str = "") -> str:
        if not txt.strip(): return ""
        return f'<div class="{" ".join(["nb-output", cls]).strip()}"><pre>{html.escape(txt.rstrip())}</pre></div>'

    def show_doc(self, md: str, i) -> str:
        "nbdev's show_doc markdown in a box; the symbol heading keeps nbdev's anchor (`config.html#solaropen2config`)."
        from markdown.extensions.toc import slugify
        md = re.sub(r"^\s*---\s*\n", "", md)
        md = _SOURCE_LINK_RE.sub("", md)  # "source" links to settings.ini's git_url: the code is on this page
        md = re.sub(r"^\*Call self as a function\.\*\s*$", "", md, flags=re.MULTILINE)  # no docstring: say nothing
        md = re.sub(r"(```python\n)(.*?)(```)", lambda m: m.group(1) + "\n".join(
            l for l in m.group(2).split("\n") if l.strip()) + "\n" + m.group(3), md, count=1, flags=re.DOTALL)
        def heading(m):
            name = m.group(2).strip()
            anchor = name.lower()
            esc = re.sub(r"([_*\\`\[\]])", r"\\\1", name)
            extra = "" if slugify(name, "-") == anchor else f'<a id="{html.escape(anchor)}"></a>'
            return f"{m.group(1)} {extra}{esc}"
        md = re.sub(r"^(#{2,4})\s+(.+?)\s*$", heading, md, count=1, flags=re.MULTILINE)
        md = self.md(md, i)
        return f'<div class="nb-doc" markdown="1">\n\n{md.strip()}\n\n</div>'

    def render(self) -> str:
        cells = self.nb["cells"]
        body = []
        for i, c in enumerate(cells):
            if c["cell_type"] == "raw":
                src = _text(c.get("source", ""))
                if i == 0 and src.lstrip().startswith("---"):
                    self.fm = yaml.safe_load(src.strip().strip("-")) or {}
                continue
            if c["cell_type"] == "markdown":
                s = self.markdown_cell(i, c)
                if s.strip() and not s.strip().startswith("<!-- WARNING: THIS FILE WAS AUTOGENERATED"): body.append(s)
            elif c["cell_type"] == "code":
                s = self.code_cell(i, c)
                if s.strip(): body.append(s)
        head = []
        title = self.fm.get("title")
        if title: head.append(f"# {title}")
        if self.fm.get("description"):
            desc = self.md(str(self.fm["description"]), 0)
            head.append(f"{desc}\n{{: .nb-subtitle }}")
        return "\n\n".join(head + body).rstrip() + "\n"

    @property
    def title(self) -> str: return str(self.fm.get("title") or posixpath.basename(self.name))

# ---------------------------------------------------------------------------------------------------------------
# 3. mkdocs
# ---------------------------------------------------------------------------------------------------------------

EXTRA_CSS = """
/* notebook outputs, API boxes and math, on top of mkdocs-material */
.md-grid { max-width: 90rem; }
.md-typeset pre > code, .md-typeset .nb-output pre { font-size: 0.7rem; }
.md-typeset .nb-subtitle { font-size: 1.05em; color: var(--md-default-fg-color--light); margin-top: -0.6em; }
.md-typeset .nb-output { margin: -0.6em 0 1em 0; border-left: 3px solid var(--md-accent-fg-color--transparent);
  border-left-color: #c9d3e0; padding-left: 0.6em; overflow-x: auto; }
.md-typeset .nb-output pre { margin: 0.2em 0; padding: 0.5em 0.8em; background: #f7f7f9; font-size: 0.78em;
  line-height: 1.4; white-space: pre; overflow-x: auto; }
.md-typeset .nb-stderr pre { background: #fff6e5; }
.md-typeset .nb-error pre { background: #fdecec; }
.md-typeset .nb-image img { max-width: 100%; }
.md-typeset .nb-doc { border: 1px solid #d6dde8; border-radius: 4px; background: #f8fafc; padding: 0 1em 0.2em;
  margin: 1.2em 0; }
.md-typeset .nb-doc h2, .md-typeset .nb-doc h3, .md-typeset .nb-doc h4 { margin-top: 0.6em;
  font-family: var(--md-code-font-family); font-weight: 600; }
.md-typeset .nb-doc > p:first-child { margin: 0.4em 0 0; }
.md-typeset math[display="block"] { display: block math; margin: 0.8em 0; overflow-x: auto; }
.md-typeset math { font-size: 1.1em; }
.md-typeset .nb-math-error { color: #b00020; }
.md-typeset table:not([class]) { font-size: 0.72rem; }
.md-typeset table:not([class]) th { background: #eef2f7; }
.md-typeset table:not([class]) td, .md-typeset table:not([class]) th { padding: 0.45em 0.9em; }
.md-typeset .nb-doc table:not([class]) td, .md-typeset .nb-doc table:not([class]) th { padding: 0.2em 0.8em; }
.md-typeset .nb-doc table:not([class]) { background: #fff; margin: 0.6em 0 1em; }
.md-typeset .highlight span.filename { font-size: 0.72em; padding: 0.3em 1em; }
.md-typeset .nb-widget { border: 1px solid #d6dde8; border-radius: 4px; padding: 0.6em 1em; background: #fbfcfe; }
.md-typeset .nb-widget-note { font-size: 0.75em; color: var(--md-default-fg-color--light); margin-bottom: 0.5em; }
.md-typeset .nb-widget-row { display: flex; align-items: center; gap: 0.8em; margin: 0.25em 0; font-size: 0.8em; }
.md-typeset .nb-widget-label { min-width: 8em; text-align: right; }
.md-typeset .nb-widget-row input[type=range] { width: 16em; }
.md-typeset .nb-widget-value { font-family: var(--md-code-font-family); }
.md-typeset .nb-widget-buttons button { border: 1px solid #c9d3e0; background: #f3f5f9; padding: 0.15em 0.9em;
  font-size: 0.9em; color: inherit; }
.md-typeset .nb-widget-buttons button.nb-widget-on { background: #3f51b5; color: #fff; border-color: #3f51b5; }
.md-typeset .nb-widget-html pre { margin: 0.5em 0 0; padding: 0.5em 0.8em; background: #f7f7f9; font-size: 0.78em; }
""".lstrip()

# Opened from the file system (file://), Chromium and Firefox refuse to start a Web Worker, and mkdocs-material's
# search runs in one. mkdocs-material's `offline` plugin fixes that with a shim loaded from a CDN, which an offline
# reader cannot reach; this stands in for it. Only on file:// pages it replaces `Worker` by a hidden iframe that
# runs the worker's script, messages passing between the two as events. Over HTTP the browser's Worker is used.
FILE_WORKER_JS = """
/* the site search on pages opened from the file system: see scripts/build_docs.py */
(function () {
  if (location.protocol !== "file:" || typeof EventTarget !== "function") return;
  class FrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.pending = [];
      const frame = this.frame = document.createElement("iframe");
      frame.hidden = true; frame.tabIndex = -1; frame.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).appendChild(frame);
      const scope = this.scope = frame.contentWindow;
      /* the worker's postMessage answers the page */
      scope.postMessage = (data) => setTimeout(() => this.dispatchEvent(new MessageEvent("message", { data })));
      const script = scope.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => { const queued = this.pending; this.pending = null; queued.forEach((d) => this.deliver(d)); };
      script.onerror = () => this.dispatchEvent(new Event("error"));
      scope.document.head.appendChild(script);
    }
    deliver(data) { setTimeout(() => this.scope.dispatchEvent(new this.scope.MessageEvent("message", { data }))); }
    postMessage(data) { if (this.pending) this.pending.push(data); else this.deliver(data); }
    terminate() { this.frame.remove(); }
  }
  window.Worker = FrameWorker;
})();
""".lstrip()

def write_offline_search(site: Path):
    "The search index as a script (`search/search_index.js`), which mkdocs-material loads on file:// pages."
    src = site/"search"/"search_index.json"
    if not src.is_file(): raise SystemExit(f"build_docs: mkdocs wrote no search index ({src})")
    (site/"search"/"search_index.js").write_text("var __index = " + src.read_text(encoding="utf-8"), encoding="utf-8")

def mkdocs_config(pages: list, ctx: dict, build: Path, site: Path) -> dict:
    nav = []
    for p in pages:
        label = "Overview" if p.name == "index" else p.title
        nav.append({label: p.name + ".md"})
    return {
        "site_name": ctx["title"],
        "site_description": ctx["description"],
        "docs_dir": str((build/"pages").resolve()),
        "site_dir": str(site.resolve()),
        "use_directory_urls": False,
        "strict": False,
        "nav": nav,
        "theme": {"name": "material", "font": False, "language": "en",
                  "palette": {"scheme": "default", "primary": "indigo", "accent": "indigo"},
                  "features": ["navigation.footer", "navigation.top", "content.code.copy", "toc.integrate"]},
        "extra_css": ["assets/nb.css"],
        "extra": {"polyfills": ["assets/file-worker.js"], "generator": False},
        "plugins": ["search"],
        "markdown_extensions": [
            "tables", "attr_list", "md_in_html", "admonition", "footnotes", "def_list", "pymdownx.details",
            {"toc": {"permalink": True}},
            {"pymdownx.highlight": {"anchor_linenums": False, "pygments_lang_class": True}},
            "pymdownx.superfences",
        ],
        "validation": {"omitted_files": "warn", "absolute_links": "info", "unrecognized_links": "warn",
                       "anchors": "warn"},
    }

def git_epoch() -> str:
    try: return subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.strip() or "0"
    except Exception: return "0"

def check_site_dir(site: Path):
    "The site folder is emptied before each build: refuse one that holds anything but a previous build."
    if site == ROOT or site in ROOT.parents or site == Path.home():
        raise SystemExit(f"build_docs: refusing to empty {site} for the site; pick a folder of its own")
    if site.exists():
        kids = {c.name for c in site.iterdir()} - {".gitkeep"}
        if kids and "sitemap.xml" not in kids and "index.html" not in kids:
            raise SystemExit(f"build_docs: {site} is not empty and holds no previous site build; not emptying it")

def build(nbs: Path, build_dir: Path, site: Path, quiet: bool = False, add: list | None = None) -> dict:
    t0 = time.time()
    from nbdev.config import get_config
    cfg = get_config()
    nbs, build_dir, site = nbs.resolve(), build_dir.resolve(), site.resolve()
    check_site_dir(site)
    sources = {rel: nbs/rel for rel in list_notebooks(nbs)}
    for f in add or []:  # extra notebooks, rendered as if they sat in nbs/ (the tests add a fixture chapter)
        f = Path(f).resolve()
        if Path(f.name) in sources: raise SystemExit(f"build_docs: --add {f}: {f.name} is already in {nbs}")
        sources[Path(f.name)] = f
    if not sources: raise SystemExit(f"build_docs: no notebooks in {nbs}")
    files = sorted(sources, key=lambda p: (p.as_posix() != "index.ipynb", p.as_posix()))
    sources = {rel: sources[rel] for rel in files}
    names = {rel: page_name(rel) for rel in files}
    dup = {n for n in names.values() if list(names.values()).count(n) > 1}
    if dup: raise SystemExit(f"build_docs: notebooks in {nbs} map to the same page name(s) {sorted(dup)}")
    doc_url = (cfg.get("doc_host", "") + cfg.get("doc_baseurl", "")).rstrip("/")
    ctx = {"names": names, "pages": set(names.values()), "doc_url": doc_url, "lang": "python",
           "lib_path": Path(str(cfg.lib_path)).name,
           "nbs_label": os.path.relpath(nbs, ROOT) if nbs.is_relative_to(ROOT) else str(nbs),
           "title": cfg.get("title", cfg.get("lib_name", "docs")), "description": cfg.get("description", ""),
           "warn": Warnings(), "nbs": nbs, "ext_files": {}}

    proc = build_dir/"_proc"
    mods = process_notebooks(sources, proc)
    t_proc = time.time() - t0

    pages_dir = build_dir/"pages"
    if pages_dir.exists(): shutil.rmtree(pages_dir)
    (pages_dir/"assets").mkdir(parents=True)
    (pages_dir/"assets"/"nb.css").write_text(EXTRA_CSS)
    (pages_dir/"assets"/"file-worker.js").write_text(FILE_WORKER_JS)
    for f in sorted(nbs.rglob("*")):  # non-notebook files next to the notebooks (images...) come along
        rel = f.relative_to(nbs)
        if not f.is_file() or f.suffix == ".ipynb" or any(p.startswith((".", "_")) for p in rel.parts): continue
        if rel.name in ("nbdev.yml", "sidebar.yml", "_quarto.yml", "styles.css"): continue
        (pages_dir/rel).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(f, pages_dir/rel)
    pages = []
    for rel in files:
        p = Page(rel, sources[rel], json.loads((proc/rel).read_text()), mods[rel], ctx)
        text = p.render()
        out = pages_dir/(p.name + ".md")
        out.parent.mkdir(parents=True, exist_ok=True); out.write_text(text)
        for fn, data in p.assets.items():
            dest = out.parent/fn; dest.parent.mkdir(parents=True, exist_ok=True); dest.write_bytes(data)
        pages.append(p)
    for key, f in sorted(ctx["ext_files"].items()):
        (pages_dir/key).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(f, pages_dir/key)

    conf = mkdocs_config(pages, ctx, build_dir, site)
    (build_dir/"mkdocs.yml").write_text("# generated by scripts/build_docs.py: edit that script, not this file\n"
                                        + yaml.safe_dump(conf, sort_keys=False, allow_unicode=True, width=120))
    os.environ.setdefault("SOURCE_DATE_EPOCH", git_epoch())
    import logging
    from mkdocs.commands.build import build as mk_build
    from mkdocs.config import load_config
    logging.getLogger("mkdocs").setLevel(logging.WARNING)
    if not logging.getLogger().handlers: logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    mk = load_config(config_file=str(build_dir/"mkdocs.yml"))
    if site.exists():  # keep a .gitkeep (docs/ is a tracked, otherwise ignored directory)
        for c in site.iterdir():
            if c.name == ".gitkeep": continue
            shutil.rmtree(c) if c.is_dir() and not c.is_symlink() else c.unlink()
    mk_build(mk, dirty=False)
    write_offline_search(site)
    for w in ctx["warn"]: print(f"build_docs: warning: {w}", file=sys.stderr)
    res = {"pages": [p.name + ".html" for p in pages], "site": str(site), "seconds": round(time.time() - t0, 2),
           "proc_seconds": round(t_proc, 2), "warnings": list(ctx["warn"])}
    if not quiet: print(f"build_docs: {len(pages)} pages ({', '.join(res['pages'])}) -> {site} in {res['seconds']} s"
                        f" (nbdev processing {res['proc_seconds']} s)")
    return res

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nbs", default=str(ROOT/"nbs"), help="notebook folder (default: nbs/)")
    ap.add_argument("--build", default=str(ROOT/"build"/"docs"), help="scratch folder: _proc/, pages/, mkdocs.yml")
    ap.add_argument("--site", default=str(ROOT/"docs"), help="output folder of the HTML site (default: docs/)")
    ap.add_argument("--add", action="append", default=[], metavar="NB",
                    help="also render this notebook, as if it were in nbs/ (repeatable; the tests add a fixture)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    os.chdir(ROOT)  # nbdev reads settings.ini from the working directory
    if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
    build(Path(a.nbs), Path(a.build), Path(a.site), a.quiet, a.add)
    return 0

if __name__ == "__main__": sys.exit(main())
