"""The docs site: `scripts/build_docs.py` renders every notebook of nbs/ into a navigable HTML site.

One build per test run (`docs_site`, tests/conftest.py; a few minutes on two cores) of nbs/ plus a fixture chapter
(tests/docsite.py) that exercises what the real chapters need (math, hidden cells, exported code, show_doc, outputs,
tables, images, a widget). Checks: every chapter has its page, the sidebar lists them in reading order, every
internal link and image resolves, the fixture's features render, search works without a server, no page loads
anything from outside the site or links to the placeholder repository, plots are legible, widgets show as a static
view; and, where Chromium is installed (always under CI), a browser searches the site from the file system and over
HTTP.
"""
import html, json, os, re, sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit
import pytest

from docsite import FIXTURE, PNG, ROOT, _cell, bd, fixture_nb

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

@pytest.fixture
def site(docs_site):
    "The site `docs_site` (tests/conftest.py) built once for the whole run: (site folder, build_docs' result)."
    return docs_site

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

def test_index_table_lists_every_chapter():
    "Every chapter notebook is a row or a sub-link of index.ipynb's reading-order table (no site build needed)."
    md = "".join("".join(c["source"]) for c in json.loads((ROOT/"nbs"/"index.ipynb").read_text())["cells"]
                 if c["cell_type"] == "markdown")
    table = md[md.index("## Reading order"):].split("\n## ")[0]
    linked = set(re.findall(r"\]\(([\w./-]+\.html)", table))
    missing = [p for p in chapter_pages()[1:] if p not in linked]
    assert not missing, f"chapters missing from the index's table: {missing}"

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


# ---------------------------------------------------------------------------------------------------------------
# reading it: search without a server, no dead or placeholder links, legible plots, the widget as a static view
# ---------------------------------------------------------------------------------------------------------------

def test_offline_search_files(site):
    "Search from the file system: the index as a script beside its JSON, and the Worker stand-in on every page."
    out, _ = site
    js, data = (out/"search"/"search_index.js").read_text(), (out/"search"/"search_index.json").read_text()
    assert js == "var __index = " + data and '"config.html' in data
    worker = (out/"assets"/"file-worker.js").read_text()
    assert 'location.protocol !== "file:"' in worker and "window.Worker = FrameWorker" in worker
    for page in sorted(out.glob("*.html")):
        html = page.read_text()
        if page.name == "404.html": continue
        assert '<script src="assets/file-worker.js"></script>' in html, page.name
        # everything the page loads is in the site: no CDN (an offline reader has none)
        ext = [r for t, k, r in parse(page).refs if t in ("script", "link", "img") and k in ("src", "href")
               and urlsplit(r).scheme in ("http", "https")]
        assert not ext, f"{page.name} loads {ext}"


def test_no_placeholder_source_links(site):
    "show_doc's 'source' links would point to settings.ini's placeholder repository: the pages have none."
    out, _ = site
    from nbdev.config import get_config
    git_url = get_config().git_url
    for page in sorted(out.glob("*.html")):
        html = page.read_text()
        assert git_url not in html and ">source</a>" not in html, page.name


def _png_width(path: Path) -> int:
    b = path.read_bytes()
    assert b[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(b[16:20], "big")


def test_plots_are_legible(site):
    "Every plot a chapter shows is at least 700 px wide (the budget chapter's three among them)."
    out, _ = site
    pngs = sorted(p for p in out.glob("*_files/*.png") if not p.parent.name.startswith("docs_fixture"))
    assert len([p for p in pngs if p.parent.name == "budget_files"]) >= 3, pngs
    narrow = [f"{p.relative_to(out)}: {_png_width(p)} px" for p in pngs if _png_width(p) < 700]
    assert not narrow, narrow


def test_widget_static_view(site):
    "A widget output becomes a static panel: each control with its value, the text widget's HTML, a note."
    out, _ = site
    body = (out/"docs_fixture.html").read_text().split("<article", 1)[1]
    panel = body[body.index('class="nb-output nb-widget"'):]
    assert bd.WIDGET_NOTE in html.unescape(panel)
    assert re.search(r'WIDGET_SLIDER</span><input type="range" min="1(\.0)?" max="9(\.0)?" step="[\d.]+" '
                     r'value="2\.5" disabled><span class="nb-widget-value">2\.5</span>', panel), panel[:800]
    assert '<button disabled class="nb-widget-on">WIDGET_ON</button>' in panel and "<pre>WIDGET_TEXT</pre>" in panel
    budget = (out/"budget.html").read_text()
    assert 'class="nb-output nb-widget"' in budget and "max-num-seqs" in budget
    assert "GPU KV cache size: 1,133,999 tokens" in budget  # the plan text of the opening state


def test_widget_html_unit():
    state = {"box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_s", "IPY_MODEL_t", "IPY_MODEL_h"]}},
             "s": {"model_name": "SelectionSliderModel", "state": {"description": "TP", "_options_labels": ["1", "2"],
                                                                   "index": 1}},
             "t": {"model_name": "ToggleButtonsModel", "state": {"_options_labels": ["auto", "fp8"], "index": 0}},
             "h": {"model_name": "HTMLModel", "state": {"value": "<pre>plan</pre>"}}}
    h = bd.widget_html("box", state)
    assert h.startswith('<div class="nb-widget-box">') and "<pre>plan</pre>" in h
    assert '<span class="nb-widget-label">TP</span><input type="range" min="0" max="1" value="1" disabled>' in h
    assert '<button disabled class="nb-widget-on">auto</button><button disabled>fp8</button>' in h
    assert bd.widget_html("missing", state) == ""


def _browser():
    "(chromium path, None) or (None, why not): the browser test needs Chromium and playwright."
    sys.path.insert(0, str(ROOT/"scripts"))
    import docs_screenshots as ds
    try: import playwright  # noqa: F401
    except ImportError: return None, "playwright is not installed (the dev extra has it)"
    chromium = ds.find_chromium()
    return (chromium, None) if chromium else (None, "no Chromium (Debian: apt-get install chromium)")


def test_search_in_a_browser(site, tmp_path):
    """Headless Chromium opens the site from the file system and over HTTP: search finds the budget chapter both
    ways, the budget plot is >= 700 px, the calculator shows. Under CI a missing browser is a failure."""
    chromium, why = _browser()
    if chromium is None:
        if os.environ.get("CI"): pytest.fail(f"CI needs the browser test: {why}")
        pytest.skip(why)
    import docs_screenshots as ds
    out, _ = site
    res = ds.check_site(out, chromium, tmp_path)
    for mode in ("file", "http"): assert "The serving budget" in res[mode], res[mode]
    assert res["plot_px"] >= 700 and "GPU KV cache size" in res["calculator"]
    for f in tmp_path.glob("*.png"): assert f.stat().st_size <= ds.MAX_PNG, f
