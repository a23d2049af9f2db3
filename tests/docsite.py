"""The docs site the tests build once (`docs_site` in tests/conftest.py): nbs/ plus a fixture chapter that exercises
what the renderer must handle (math, hidden cells, exported code, show_doc, outputs, tables, images, a widget)."""
import base64, importlib.util, json, os, subprocess, sys
from pathlib import Path

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
        _cell("code", "#| exec_doc\nimport ipywidgets as W\nW.VBox([W.FloatSlider(value=2.5, min=1, max=9, description='WIDGET_SLIDER'), "
                      "W.ToggleButtons(options=['a', 'WIDGET_ON'], value='WIDGET_ON'), W.HTML('<pre>WIDGET_TEXT</pre>')])"),
        _cell("code", "#| echo: false\nECHO_FALSE_MARKER = 1",
              [{"output_type": "execute_result", "execution_count": None, "metadata": {},
                "data": {"text/plain": ["'ECHO_FALSE_OUTPUT'"]}}]),
    ]
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "python3", "language": "python",
                                                         "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}



def build_site(tmp: Path):
    "Build nbs/ plus the fixture chapter into `tmp`; returns (site folder, the finished process)."
    (tmp/"fixture").mkdir(); (tmp/"results").mkdir()
    (tmp/"fixture"/FIXTURE).write_text(json.dumps(fixture_nb(), indent=1))
    (tmp/"results"/"plot.png").write_bytes(base64.b64decode(PNG))  # referenced from outside the notebook folder
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, str(ROOT/"scripts"/"build_docs.py"), "--add", str(tmp/"fixture"/FIXTURE),
                        "--build", str(tmp/"build"), "--site", str(tmp/"site")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"build_docs failed:\n{r.stdout}\n{r.stderr}"
    return tmp/"site", r

