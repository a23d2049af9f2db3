#!/usr/bin/env python
"""Open the docs site in headless Chromium, from the file system and over HTTP, use its search, and take screenshots.

    python scripts/docs_screenshots.py [--site docs] [--out tests/artifacts/screenshots] [--chromium PATH]

Needs Chromium (Debian: `apt-get install chromium`) and the `playwright` package (the dev extra; it drives the
browser installed on the machine and downloads none). For each way of opening the site (`file`: `file://.../index.html`;
`http`: the site folder served on 127.0.0.1) it types a query into the search box and waits for results, then
shows the budget chapter's first plot and its calculator. Screenshots are PNGs of at most 300 KB each:
`search-file.png`, `search-http.png`, `budget-plot-file.png`, `calculator-http.png`. `tests/test_docs.py` runs
the same checks (`check_site`) without writing the pictures.
"""
from __future__ import annotations
import argparse, contextlib, functools, http.server, io, os, shutil, socketserver, sys, tempfile, threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUERY = "kv cache"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
MAX_PNG = 300_000


def find_chromium(explicit: str | None = None) -> str | None:
    "The Chromium to drive: `explicit`, $CHROMIUM, or chromium / chromium-browser / google-chrome on PATH."
    for c in (explicit, os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if c and (p := shutil.which(c)): return p
    return None


@contextlib.contextmanager
def serve(site: Path):
    "The site folder over HTTP on 127.0.0.1 (a free port); yields the base URL."
    handler = functools.partial(_QuietHandler, directory=str(site))
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as httpd:
        t = threading.Thread(target=httpd.serve_forever, daemon=True); t.start()
        try: yield f"http://127.0.0.1:{httpd.server_address[1]}/"
        finally: httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass


@contextlib.contextmanager
def browser(chromium: str):
    "A headless Chromium page (1200x760 viewport) that records the page's errors in `page.errors`."
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
                                                    viewport={"width": 1200, "height": 760})
        try:
            page = ctx.new_page()
            page.errors = []
            page.on("pageerror", lambda e: page.errors.append(str(e)))
            yield page
        finally: ctx.close()


def search(page, base: str, query: str = QUERY, timeout_ms: int = 20_000) -> list[str]:
    "Open the site's index page, type `query` into the search box, wait for results; return their titles."
    page.goto(base + "index.html")
    box = page.locator("input.md-search__input")  # the header's search box (a wide window shows it)
    box.click(); box.fill(""); box.type(query, delay=20)
    page.wait_for_selector(".md-search-result__item", timeout=timeout_ms)
    return [t.strip() for t in page.locator(".md-search-result__item h1, .md-search-result__item h2").all_inner_texts()]


def to_top(page, locator):
    "Scroll so that the element starts just below the page header."
    locator.evaluate("e => { e.scrollIntoView({block: 'start'}); window.scrollBy(0, -64); }")
    page.wait_for_timeout(200)


def shrink(png: bytes) -> bytes:
    "A screenshot as a 256-colour PNG (text pages stay sharp; a fraction of the size)."
    from PIL import Image
    im = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO(); im.save(out, format="PNG", optimize=True)
    return out.getvalue()


def check_site(site: Path, chromium: str, out: Path | None = None) -> dict:
    """Search from file:// and over HTTP, the budget plot and the calculator; screenshots into `out` when given.
    Returns {"file": [result titles], "http": [...], "plot_px": natural width, "calculator": text}; raises
    AssertionError naming what failed."""
    site = site.resolve()
    res = {}
    def shot(page, name, **kw):
        if out is None: return
        # the address in a corner, as a browser's address bar would show it (file:// or http://)
        page.evaluate("""() => { const d = document.createElement('div'); d.textContent = location.href;
            d.style.cssText = 'position:fixed;right:8px;bottom:8px;z-index:9;padding:2px 8px;font:12px monospace;' +
                              'background:#fffbe6;border:1px solid #e0d090;color:#333'; document.body.appendChild(d); }""")
        data = shrink(page.screenshot(**kw))
        assert len(data) <= MAX_PNG, f"{name}: {len(data)} bytes"
        out.mkdir(parents=True, exist_ok=True); (out/name).write_bytes(data)
    with serve(site) as http_base, browser(chromium) as page:
        for mode, base in (("file", site.as_uri() + "/"), ("http", http_base)):
            titles = search(page, base)
            assert titles, f"search from {mode}: no results for {QUERY!r}"
            assert not page.errors, f"search from {mode}: page errors {page.errors}"
            res[mode] = titles
            shot(page, f"search-{mode}.png")
        for mode, base in (("file", site.as_uri() + "/"), ("http", http_base)):
            page.goto(base + "budget.html")
            img = page.locator("img[src*='budget_files/']").first
            to_top(page, img)
            res["plot_px"] = page.evaluate("(i) => i.naturalWidth", img.element_handle())
            if mode == "file": shot(page, "budget-plot-file.png")
            calc = page.locator(".nb-widget").first
            to_top(page, calc)
            res["calculator"] = calc.inner_text()
            if mode == "http": shot(page, "calculator-http.png")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--site", default=str(ROOT/"docs"), help="the built site (default: docs/, from `make docs`)")
    ap.add_argument("--out", default=str(ROOT/"tests"/"artifacts"/"screenshots"), help="where the PNGs go")
    ap.add_argument("--chromium", default=None, help="the Chromium binary (default: chromium on PATH)")
    a = ap.parse_args(argv)
    chromium = find_chromium(a.chromium)
    if not chromium: sys.exit("docs_screenshots: no Chromium found (Debian: apt-get install chromium; or --chromium PATH)")
    if not (Path(a.site)/"index.html").is_file(): sys.exit(f"docs_screenshots: no site in {a.site}: run `make docs` first")
    res = check_site(Path(a.site), chromium, Path(a.out))
    print(f"search results from file://: {len(res['file'])}, over HTTP: {len(res['http'])}; budget plot "
          f"{res['plot_px']} px wide; screenshots in {a.out}")
    return 0


if __name__ == "__main__": sys.exit(main())
