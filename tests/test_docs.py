"""The docs site: `scripts/build_docs.py` renders every notebook of nbs/ into a navigable HTML site.

One build (about 40 s on two cores) into a tmp dir, of nbs/ plus a fixture chapter (`--add`) that exercises what the real
chapters will need (math, hidden cells, exported code, show_doc, outputs, tables, images). Checks: every chapter has
its page, the sidebar lists them in reading order, every internal link and image resolves, and the fixture's
features render. No browser needed.
"""
import base64, importlib.util, json, os, re, subprocess, sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("build_docs", ROOT/"scripts"/"build_docs.py")
bd = importlib.util.module_from_spec(spec); spec.loader.exec_module(bd)

FIXTURE = "99z_docs_fixture.ipynb"  # page "docs_fixture.html"; sorts after every chapter
# a 1x1 PNG
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

def _cell(kind, src, outputs=None):
    c = {"cell_type": kind, "metadata": {}, "source": src}
    if kind == "code": c.update(execution_count=None, outputs=outputs or [])
    return c

def fixture_nb() -> dict:
    cells = [
        _cell("code", "#| default_exp docs_fixture"),
        _cell("markdown", "# Fixture chapter\n\n> What the renderer must handle, with $x^2$ in the subtitle."),
        _cell("code", "#| hide\nHIDDEN_MARKER_7f3a = 1"),
        _cell("markdown", "The state update is $S_t = S_{t-1} (\\mathrm{Diag}(\\alpha_t) - \\beta_t k_t k_t^\\top)$ "
                          "and it costs $5 and $6, literally; `$not_math$` stays code; \\$ is a dollar.\n\n"
                          "$$\no_t = S_t^\\top q_t, \\quad |x| = \\sqrt{\\sum_i x_i^2}\n$$\n\n"
                          "A list right after a paragraph:\n- first\n  - nested two spaces\n- second\n\n"
                          "| quantity | value |\n|---|---|\n| $d_k$ | 128 |\n\n"
                          "> A blockquoted note linking [the overview](index.html) and [this page](#the-section).\n\n"
                          "## The section\n\nSee `fixture_double` below. ![a plot](../results/plot.png)"),
        _cell("code", "#| export\ndef fixture_double(x:int, # the input\n                  )->int: # twice x\n"
                      "    \"Double `x` (EXPORTED_MARKER).\"\n    return 2 * x"),
        _cell("code", "print('OUTPUT_MARKER', fixture_double(21))",
              [{"output_type": "stream", "name": "stdout", "text": ["OUTPUT_MARKER 42\n"]}]),
        _cell("code", "plot()", [{"output_type": "display_data", "metadata": {},
                                  "data": {"image/png": PNG, "text/plain": ["<Figure>"]}}]),
        _cell("code", "import os\nraise RuntimeError('a test cell that imports ran during the docs build')",
              [{"output_type": "stream", "name": "stdout", "text": ["STORED_TEST_OUTPUT\n"]}]),
        _cell("code", "#| echo: false\nECHO_FALSE_MARKER = 1",
              [{"output_type": "execute_result", "execution_count": None, "metadata": {},
                "data": {"text/plain": ["'ECHO_FALSE_OUTPUT'"]}}]),
    ]
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "python3", "language": "python",
                                                         "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}

class _Refs(HTMLParser):
    "Collects ids/names (anchors) and the href/src of every element."
    def __init__(self):
        super().__init__(); self.ids, self.refs = set(), []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("id", "name"):
            if a.get(k): self.ids.add(a[k])
        for k in ("href", "src"):
            if a.get(k) is not None: self.refs.append((tag, k, a[k]))

def parse(path: Path) -> _Refs:
    p = _Refs(); p.feed(path.read_text(encoding="utf-8")); return p

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    (tmp/"fixture").mkdir(); (tmp/"results").mkdir()
    (tmp/"fixture"/FIXTURE).write_text(json.dumps(fixture_nb(), indent=1))
    (tmp/"results"/"plot.png").write_bytes(base64.b64decode(PNG))  # referenced from outside the notebook folder
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, str(ROOT/"scripts"/"build_docs.py"), "--add", str(tmp/"fixture"/FIXTURE),
                        "--build", str(tmp/"build"), "--site", str(tmp/"site")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"build_docs failed:\n{r.stdout}\n{r.stderr}"
    return tmp/"site", r

def chapter_pages() -> list:
    "Expected page of every notebook in the repo's nbs/, in reading order."
    return [bd.page_name(p) + ".html" for p in bd.list_notebooks(ROOT/"nbs")]

def test_page_names_and_order():
    pages = chapter_pages()
    assert pages[0] == "index.html"
    assert {"config.html", "cli.html"} <= set(pages)
    assert pages.index("config.html") < pages.index("cli.html")  # 00_config before 12_cli
    assert bd.page_name(Path("03a_kda.ipynb")) == "kda" and bd.page_name(Path("index.ipynb")) == "index"

def test_every_chapter_has_a_page(site):
    out, _ = site
    for page in chapter_pages() + ["docs_fixture.html"]:
        assert (out/page).is_file(), f"missing page {page}"
    assert not (out/"00_config.html").exists()

def _from_root(page: str, href: str) -> str:
    "A link on `page` (a path from the site root) as a path from the site root; a folder link means its index.html."
    import posixpath
    if re.match(r"^[a-z][a-z0-9+.-]*:|^/|^#", href): return href
    path = posixpath.normpath(posixpath.join(posixpath.dirname(page), href.split("#")[0]))
    return "index.html" if path == "." else posixpath.join(path, "index.html") if href.split("#")[0].endswith("/") else path

def test_sidebar_lists_chapters_in_reading_order(site):
    out, _ = site
    expected = chapter_pages() + ["docs_fixture.html"]
    for page in expected:
        hrefs = [_from_root(page, r) for t, k, r in parse(out/page).refs if t == "a" and k == "href"]   # pages in folders (08_vllm/) link relatively
        nav = [h for h in hrefs if h in expected or h == "./"]  # material links the home page as "index.html"
        order = list(dict.fromkeys(h for h in nav if h in expected))
        missing = [p for p in expected if p not in order and p != page]
        assert not missing, f"{page}: sidebar lacks {missing}"
        assert [p for p in order if p != page] == [p for p in expected if p != page], f"{page}: nav order {order}"

def test_internal_links_resolve(site):
    out, _ = site
    anchors = {}
    bad = []
    for page in sorted(out.rglob("*.html")):
        if page.name == "404.html": continue  # a web server's error page: root-absolute links by design
        for tag, attr, ref in parse(page).refs:
            u = urlsplit(ref)
            if u.scheme or ref.startswith("//") or ref.startswith(("data:", "mailto:", "javascript:")): continue
            target = (page.parent/unquote(u.path)).resolve() if u.path else page
            if u.path.endswith("/") or target.is_dir(): target = target/"index.html"
            if not target.exists():
                bad.append(f"{page.relative_to(out)}: <{tag} {attr}={ref!r}> -> missing {target}"); continue
            if u.fragment and target.suffix == ".html":
                if target not in anchors: anchors[target] = parse(target).ids
                if unquote(u.fragment) not in anchors[target]:
                    bad.append(f"{page.relative_to(out)}: <{tag} {attr}={ref!r}> -> no id {u.fragment!r}")
    assert not bad, "broken links:\n" + "\n".join(bad[:40])

def test_index_links_every_landed_chapter(site):
    "index.ipynb's chapter table links the pages by the names the site uses (and README.md gets them too)."
    out, _ = site
    html = (out/"index.html").read_text()
    for page in ("config.html", "cli.html"):
        assert re.search(rf'<td><a href="{re.escape(page)}">', html), page

def test_api_docs_and_anchors(site):
    out, _ = site
    html = (out/"config.html").read_text()
    assert 'class="nb-doc"' in html and 'id="solaropen2config"' in html and 'id="derive_layer_types"' in html
    # parameter tables from docments, also for classes (whose source only the exported module can give back)
    assert html.count("<th><strong>Details</strong></th>") >= 2, "show_doc boxes without parameter tables"
    assert "solar_open2/config.py" in html  # exported cells are titled with their module
    # nbdev's doc links inside the site are relative, never the (unpublished) doc_host
    assert "solar-open2.github.io" not in html
    assert 'href="config.html#solaropen2config"' in (out/"cli.html").read_text() + html

def test_fixture_features(site):
    out, _ = site
    html = (out/"docs_fixture.html").read_text()
    body = html.split('<article', 1)[1]
    # math: MathML, inline and block; literal dollars and code spans untouched
    assert body.count("<math") >= 4 and 'display="block"' in body
    assert "\\alpha" not in body and "$x^2$" not in html
    assert "costs $5 and $6" in body and "<code>$not_math$</code>" in body and re.search(r"(\$|&#36;) is a dollar", body)
    # hidden cells vanish; exported code, its show_doc and outputs show; echo: false hides code, keeps output
    assert "HIDDEN_MARKER_7f3a" not in html
    assert "EXPORTED_MARKER" in body and "solar_open2/docs_fixture.py" in body and 'id="fixture_double"' in body
    assert re.search(r"<td><code>x</code></td>\s*<td>int</td>\s*<td>the input</td>", body)
    assert "OUTPUT_MARKER 42" in body
    # a test cell that imports is not executed by the build (it raises: nbdev would stop the build); its stored
    # output shows
    assert "STORED_TEST_OUTPUT" in body and "Traceback" not in body
    assert "ECHO_FALSE_MARKER" not in body and "ECHO_FALSE_OUTPUT" in body
    assert re.search(r'<img src="docs_fixture_files/cell\d+-out0\.png"', body)
    assert re.search(r'<img alt="a plot" src="ext/[0-9a-f]{10}/plot\.png"', body)  # copied in; resolves (links test)
    # markdown: list after a paragraph, nested list, table, blockquote
    assert re.search(r"<li>first\s*<ul>\s*<li>nested two spaces</li>", body)
    assert "<table>" in body and "<blockquote>" in body

def test_test_cells_with_imports_unit():
    "Which cells the build executes: nbdev's choice (exports, imports, show_doc) minus test cells that import."
    from execnb.nbio import dict2nb
    cells = dict2nb({"cells": [_cell("code", s) for s in (
        "import os\nx = os.sep",                 # 0 a test cell that imports: skipped
        "import os, sys\nfrom pathlib import Path",  # 1 imports only: runs
        "#| export\nimport os\nX = 1",          # 2 exported: runs
        "from nbdev.showdoc import show_doc\nshow_doc(len)",  # 3 show_doc: runs
        "x = 1",                                   # 4 no import: nbdev does not run it; not a test cell with imports
        "%time import os",                         # 5 magic: nbdev decides
        "#| exec_doc\nimport os\nprint(1)")],    # 6 exec_doc: runs
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).cells
    from nbdev.process import extract_directives
    for c in cells: c.directives_ = extract_directives(c, remove=False)  # what nbdev's NBProcessor sets
    assert [bd.is_test_cell_with_imports(c) for c in cells] == [True, False, False, False, False, False, False]

def test_markdown_normalisation_unit():
    n = bd.normalize_markdown
    assert n("It costs $5 and $6.") == "It costs $5 and $6."
    assert "<math" in n("a $x$ b") and "`$x$`" in n("a `$x$` b") and "&#36;" in n("a \\$ b")
    assert n("```python\nx = '$a$'\n```") == "```python\nx = '$a$'\n```"  # code is never touched
    assert n("Para\n- a\n  - b") == "Para\n\n- a\n    - b"
    assert n("text\n| a |\n|---|") == "text\n\n| a |\n|---|"
    w = bd.Warnings()
    assert "nb-math-error" in bd.tex_to_mathml("\\frac{a}{", False, "here", w) and w and "here" in w[0]
