"""Every command the README shows, and every example in the command line's `--help` texts, runs as written.

README.md (written from nbs/index.ipynb):
- each line of a fenced `sh` block is a command, run from the repository root with this test's Python environment
  first on PATH. A command that would take the whole machine or a GPU runs on a CPU-safe target instead, by a rule
  of `RULES` (one per command form; a command no rule knows fails the test, so a new README command gets one):
  `make run` / `make test` / `make docs` run the Makefile's real recipes with the installed environment (`-o` its
  install stamp: nothing is reinstalled), `make test` on one small test file, `make docs` on the index notebook
  into a temporary site; `python -m http.server` serves that site on a free port until it answers; `pip install`
  resolves with `--dry-run`; `vllm serve` (GPU only) is parsed and validated by vLLM's own command line, with the
  plugin loaded and its parser names checked, without starting an engine;
- the `python` blocks run in order in one fresh interpreter, and what they print must equal the output block the
  README shows after them;
- `make TARGET` and `solar-open2 SUBCOMMAND` written inline in the prose must exist.

`--help` texts: `solar-open2 --help` and every subcommand's (nested ones too) exit 0. An example is a help line
that starts with `solar-open2 ` (or `$ solar-open2 `) under a heading line `example:`/`examples:`, or anywhere
after `$ `. Each runs in a subprocess, with these placeholders replaced: `DIR`, `CHECKPOINT` and `MODEL_DIR` by the
built-in tiny checkpoint (`make-tiny DIR` by a new folder), `OUT` and `OUT_DIR` by a new folder, `URL` and any
`http://127.0.0.1:PORT`/`http://localhost:PORT` by a fake OpenAI-compatible server on loopback (`bench`'s own), `TRACE` by a
trace file `bench make-trace` writes. It fails on a usage error (exit 2), a traceback, or running past 120 s;
exit 1 (a check that fails on this machine, e.g. a node preflight without a GPU) is allowed.
"""
from __future__ import annotations
import os, re, shlex, shutil, signal, socket, subprocess, sys, time, urllib.request
from pathlib import Path

import pytest

from helptexts import all_helps, nested, subcommands

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
VENV = BIN.parent


def env():
    "The environment commands run in: this interpreter's bin/ first on PATH, the repository on PYTHONPATH."
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), e.get("PYTHONPATH")]))
    e["PYTHONUNBUFFERED"] = "1"
    return e


def run(argv, timeout=300, **kw):
    return subprocess.run(argv, cwd=kw.pop("cwd", ROOT), env=kw.pop("env", env()), capture_output=True, text=True,
                          timeout=timeout, **kw)


def ok(r, what):
    assert r.returncode == 0, f"{what}: exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert "Traceback (most recent call last)" not in r.stderr, f"{what}: traceback\n{r.stderr[-3000:]}"


# ---------------------------------------------------------------------------------------------------------------
# README.md
# ---------------------------------------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def readme_blocks(text: str) -> list[tuple[str, str]]:
    "[(language, body)] of the fenced blocks, in order."
    return [(m.group(1), m.group(2)) for m in _FENCE_RE.finditer(text)]


def shell_commands(text: str) -> list[str]:
    "Each command of the `sh`/`bash`/`shell`/`console` blocks (continuation lines joined, comments and `$ ` dropped)."
    cmds = []
    for lang, body in readme_blocks(text):
        if lang not in ("sh", "bash", "shell", "console"): continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ").strip()
            if line and not line.startswith("#"): cmds.append(line)
    return cmds


def python_blocks(text: str) -> tuple[str, str]:
    "(the `python` blocks joined, the untagged output blocks that follow them joined): code and what it prints."
    code, out, blocks = [], [], readme_blocks(text)
    for i, (lang, body) in enumerate(blocks):
        if lang != "python": continue
        code.append(body)
        if i + 1 < len(blocks) and blocks[i + 1][0] == "": out.append(blocks[i + 1][1])
    return "\n".join(code), "".join(out)


README = (ROOT/"README.md").read_text(encoding="utf-8")
COMMANDS = shell_commands(README)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


class Ctx:
    "What the rules share: a temporary folder, and the site `make docs` built there (for `http.server`)."
    def __init__(self, tmp: Path): self.tmp, self.site = tmp, None

    def make(self, target, *extra):
        "`make TARGET` with this environment: the install step is never remade (`-o` its stamp)."
        stamp = VENV/".installed"
        return ["make", "--no-print-directory", target, f"VENV={VENV}", "-o", str(stamp), *extra]


def rule_make_run(cmd, ctx):
    r = run(ctx.make("run"), timeout=600); ok(r, cmd)
    assert "The capital of Japan is" in r.stdout, r.stdout


def rule_make_test(cmd, ctx):
    # the real recipe on one small file (the whole suite runs as itself, not from here)
    r = run(ctx.make(cmd.split()[1], "TESTS=tests/test_foundation.py"), timeout=600); ok(r, cmd)
    assert re.search(r"\d+ passed", r.stdout.splitlines()[-1]), r.stdout[-500:]


def rule_make_docs(cmd, ctx):
    nbs, site = ctx.tmp/"nbs", ctx.tmp/"site"
    nbs.mkdir(exist_ok=True); shutil.copy(ROOT/"nbs"/"index.ipynb", nbs/"index.ipynb")
    r = run(ctx.make("docs", f"NBS={nbs}", f"SITE={site}"), timeout=600); ok(r, cmd)
    assert (site/"index.html").is_file() and (site/"search"/"search_index.js").is_file()
    ctx.site = site


def rule_make_other(cmd, ctx):
    r = run(ctx.make(cmd.split()[1]), timeout=120); ok(r, cmd)


def rule_http_server(cmd, ctx):
    argv = shlex.split(cmd)
    assert argv[:3] == ["python", "-m", "http.server"], cmd
    if ctx.site is None: rule_make_docs("make docs", ctx)
    port = free_port()
    args = [str(port) if a.isdigit() else a for a in argv[3:]]
    if "--directory" in args: args[args.index("--directory") + 1] = str(ctx.site)
    p = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", *args], cwd=ROOT, env=env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline, body = time.time() + 30, None
        while time.time() < deadline and body is None:
            try: body = urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=2).read().decode()
            except OSError: time.sleep(0.3)
        assert body and "solar-open2" in body, f"{cmd}: the site did not answer on port {port}"
    finally:
        os.killpg(p.pid, signal.SIGTERM); p.wait(10)


def rule_pip_install(cmd, ctx):
    argv = shlex.split(cmd)
    assert argv[:2] == ["pip", "install"], cmd
    r = run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "--disable-pip-version-check",
             *argv[2:]], timeout=600)
    ok(r, cmd)
    assert "Would install" in r.stdout and "solar-open2" in r.stdout.replace("solar_open2", "solar-open2"), r.stdout


def rule_solar_open2(cmd, ctx):
    argv = shlex.split(cmd)
    r = run([str(BIN/"solar-open2"), *argv[1:]], timeout=300); ok(r, cmd)


VLLM_SERVE_CHECK = r'''
import sys
from unittest import mock
sys.argv = ["vllm", *sys.argv[1:]]
from vllm import platforms
if platforms.current_platform.is_unspecified():  # no GPU here: parse as on a CPU (what `vllm bench` does)
    from vllm.platforms.cpu import CpuPlatform
    platforms.current_platform = CpuPlatform()
import vllm.entrypoints.cli.serve as serve
from vllm.entrypoints.cli.main import main
seen = {}
def parsed(args): seen["args"] = args      # instead of starting the server
with mock.patch.object(serve.ServeSubcommand, "cmd", staticmethod(parsed)): main()
args = seen["args"]
from vllm.plugins import load_general_plugins
load_general_plugins()                      # the package's plugin, as vllm serve loads it
import vllm.engine.arg_utils as arg_utils
# with HF_HUB_OFFLINE (as CI sets) vLLM swaps a hub id for its local snapshot, which a machine that never downloaded
# the model lacks: the id stays as written, the arguments are validated all the same
with mock.patch.object(arg_utils, "get_model_path", lambda model, revision=None: model):
    arg_utils.AsyncEngineArgs.from_cli_args(args)
if args.reasoning_parser:
    from vllm.reasoning import ReasoningParserManager
    ReasoningParserManager.get_reasoning_parser(args.reasoning_parser)
if args.tool_call_parser:
    from vllm.tool_parsers import ToolParserManager
    ToolParserManager.get_tool_parser(args.tool_call_parser)
print("parsed:", args.model)
'''


def rule_vllm_serve(cmd, ctx):
    argv = shlex.split(cmd)
    assert argv[:2] == ["vllm", "serve"], cmd
    r = run([sys.executable, "-c", VLLM_SERVE_CHECK, *argv[1:]], timeout=600); ok(r, cmd)
    assert "parsed:" in r.stdout, r.stdout


RULES = [  # (pattern of the command, rule)
    (r"make run$", rule_make_run),
    (r"make test(-slow|-all)?$", rule_make_test),
    (r"make docs$", rule_make_docs),
    (r"make (help|check-sync)$", rule_make_other),
    (r"python -m http\.server\b", rule_http_server),
    (r"pip install ", rule_pip_install),
    (r"solar-open2( |$)", rule_solar_open2),
    (r"vllm serve ", rule_vllm_serve),
]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory): return Ctx(tmp_path_factory.mktemp("readme"))


def test_readme_has_commands():
    "The README shows the two first commands, the install from the checkout, and serving."
    assert COMMANDS[:2] == ["make run", "make test"], COMMANDS
    assert any(c.startswith("pip install -e ") for c in COMMANDS) and any(c.startswith("vllm serve ") for c in COMMANDS)
    assert "pip install solar-open2" not in README  # the package is not on PyPI


@pytest.mark.parametrize("cmd", COMMANDS, ids=[re.sub(r"\W+", "_", c)[:40].strip("_") for c in COMMANDS])
def test_readme_command(cmd, ctx):
    rule = next((f for pat, f in RULES if re.match(pat, cmd)), None)
    assert rule, f"README command {cmd!r}: no rule in tests/test_commands.py says how to run it here"
    rule(cmd, ctx)


def test_readme_python_prints_what_it_shows():
    code, shown = python_blocks(README)
    assert code.strip() and shown.strip()
    r = run([sys.executable, "-c", code], timeout=300); ok(r, "README python")
    assert r.stdout.rstrip() == shown.rstrip(), f"README shows\n{shown}\nbut the code prints\n{r.stdout}"


_INLINE_RE = re.compile(r"(?<!`)`((?:make|solar-open2) [^`]+)`(?!`)")


def test_readme_inline_commands_exist():
    "`make X` and `solar-open2 X` written in the prose name a target and a subcommand that exist."
    prose = _FENCE_RE.sub("", README)
    found = sorted(set(_INLINE_RE.findall(prose)))
    assert any(f.startswith("make ") for f in found), found
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT/"Makefile").read_text(), re.MULTILINE))
    for f in found:
        words = f.split()
        if words[0] == "make": assert words[1] in targets, f"README mentions `{f}`: no such Makefile target"
        else:
            r = run([str(BIN/"solar-open2"), words[1], "--help"], timeout=120); ok(r, f"`{f}` --help")


# ---------------------------------------------------------------------------------------------------------------
# --help texts and their examples
# ---------------------------------------------------------------------------------------------------------------

def examples(help_text: str) -> list[str]:
    "The example commands of a help text (see the module docstring)."
    found, in_examples = [], False
    for line in help_text.splitlines():
        s = line.strip()
        if re.match(r"^examples?:$", s, re.IGNORECASE): in_examples = True; continue
        if in_examples and s and not line.startswith(" ") and not s.startswith(("solar-open2", "$")): in_examples = False
        if s.startswith("$ solar-open2 ") or (in_examples and s.startswith("solar-open2 ")):
            found.append(s.removeprefix("$ ").split("  #")[0].strip())
    return found


def test_examples_are_found():
    "The extraction itself, on a help text of the documented form."
    text = ("usage: solar-open2 x [-h]\n\noptions:\n  -h, --help  show this\n\nexamples:\n"
            "  solar-open2 x --tp 2\n  $ solar-open2 x DIR   # a checkpoint\n\nnotes:\n  solar-open2 x is not one\n")
    assert examples(text) == ["solar-open2 x --tp 2", "solar-open2 x DIR"]
    assert examples("see $ solar-open2 info --preset tiny for more") == []  # `$ ` must start the line
    assert subcommands("usage\n\nsubcommands:\n  info   print\n  bench  measure\n\nmore") == ["info", "bench"]
    assert nested("usage: solar-open2 bench [-h] {smoke,single} ...\n\nx") == ["smoke", "single"]
    assert nested("usage: solar-open2 bench smoke [-h] [--api {chat,completions}] [--url URL]\n\nx") == []


@pytest.fixture(scope="module")
def helps(): return all_helps()


def test_every_subcommand_has_help(helps):
    "Every subcommand answers --help (exit 0) and describes itself."
    assert len([k for k in helps if len(k) == 1]) >= 7, sorted(helps)
    for path, text in helps.items():
        assert text.strip().startswith("usage:") or not path, f"solar-open2 {' '.join(path)} --help:\n{text}"


class Targets:
    "Stand-ins for an example's placeholders: the tiny checkpoint, new folders, a fake server, a trace."
    def __init__(self, tmp: Path):
        self.tmp, self._tiny, self.n, self.server, self._trace = tmp, None, 0, None, None

    @property
    def tiny(self) -> Path:
        if self._tiny is None:
            from solar_open2.checkpoint import make_tiny
            self._tiny = make_tiny(self.tmp/"tiny", "compressed-tensors")
        return self._tiny

    def new_dir(self) -> str:
        self.n += 1; return str(self.tmp/f"out{self.n}")

    def url(self) -> str:
        if self.server is None:
            from solar_open2.bench import FakeOpenAIServer
            self.server = FakeOpenAIServer(ttft=0.01, itl=0.001).__enter__()
        return self.server.url

    def trace(self) -> str:
        if self._trace is None:
            self._trace = str(self.tmp/"trace.jsonl")
            r = run([str(BIN/"solar-open2"), "bench", "make-trace", self._trace], timeout=120)
            ok(r, "bench make-trace")
        return self._trace

    def substitute(self, argv: list[str]) -> list[str]:
        out = []
        for i, a in enumerate(argv):
            if a in ("DIR", "CHECKPOINT", "MODEL_DIR") or a.startswith("/models/"):
                a = self.new_dir() if argv[1:2] == ["make-tiny"] else str(self.tiny)
            elif a in ("OUT", "OUT_DIR"): a = self.new_dir()
            elif a == "URL" or re.match(r"^https?://(127\.0\.0\.1|localhost):\d+", a): a = self.url()
            elif a == "TRACE": a = self.trace()
            out.append(a)
        if out[1:2] == ["bench"] and out[2:3] != ["make-trace"] and len(out) > 2 and not any(a == "--url" or a.startswith("--url=") for a in out):
            out += ["--url", self.url()]   # bench's default URL is a local server: point it at the fake one
        return out


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    t = Targets(tmp_path_factory.mktemp("examples"))
    yield t
    if t.server is not None: t.server.__exit__(None, None, None)


def test_help_examples_run(helps, targets, progress):
    found = [(path, ex) for path, text in helps.items() for ex in examples(text)]
    bad = []
    for path, ex in found:
        progress(ex)
        argv = targets.substitute(shlex.split(ex))
        try: r = run([str(BIN/"solar-open2"), *argv[1:]], timeout=120, cwd=targets.tmp)   # relative outputs land in tmp
        except subprocess.TimeoutExpired: bad.append(f"{ex}: ran past 120 s"); continue
        if r.returncode == 2 or r.returncode not in (0, 1) or "Traceback (most recent call last)" in r.stderr:
            bad.append(f"{ex}  (as {' '.join(argv)}): exit {r.returncode}\n{(r.stderr or r.stdout)[-1500:]}")
    assert not bad, f"{len(bad)} of {len(found)} help examples fail:\n\n" + "\n\n".join(bad)
