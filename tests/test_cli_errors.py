"""Every subcommand driven with bad values: each ends in one line naming the problem (exit 2), never a traceback;
every option has its help; the examples the help shows parse; `--version`; a closed pipe ends quietly."""
import argparse, contextlib, io, os, subprocess, sys, threading
from pathlib import Path

import pytest

from solar_open2.cli import COMMANDS, main

NODE = ["--head-ip", "10.0.0.1", "--worker-ip", "10.0.0.2", "--ifname", "enp1s0f1np1", "--model", "/m", "--venv", "/v"]


@pytest.fixture(scope="module")
def junk(tmp_path_factory):
    d = tmp_path_factory.mktemp("junk")
    os.mkfifo(d / "fifo")
    (d / "notjson.json").write_text("{nope")
    (d / "nan.json").write_text('{"files": {"a": NaN}}')
    return d


def run(argv, seconds=120):
    "main(argv) in a thread (a FIFO read would block it): (exit code, stdout, stderr)."
    out, err, res = io.StringIO(), io.StringIO(), {}
    def go():
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try: res["rc"] = main(argv)
            except SystemExit as e: res["rc"] = e.code
            except BaseException as e: res["exc"] = e
    t = threading.Thread(target=go, daemon=True); t.start(); t.join(seconds)
    assert not t.is_alive(), f"{argv} still running after {seconds} s"
    assert "exc" not in res, f"{argv} raised {res.get('exc')!r}: a traceback"
    return res["rc"], out.getvalue(), err.getvalue()


BAD = {   # subcommand -> [(argv, what the one line must say)]
    "info": [(["/nonexistent"], "no config.json"), (["{junk}/notjson.json"], "not valid JSON"), (["{junk}/fifo"], "not a regular file"),
             (["--preset", "huge"], "invalid choice"), (["--json", "x\n"], "control character")],
    "generate": [(["--max-new-tokens", "0"], "--max-new-tokens"), (["--max-new-tokens", "x"], "--max-new-tokens"),
                 (["--temperature", "nan"], "not a finite number"), (["--temperature", "-1"], "--temperature"),
                 (["--top-p", "0"], "--top-p"), (["--top-p", "1.5"], "--top-p"), (["--device", "bogus"], "not a torch device"),
                 (["--device", "cuda:7"], "--device"), (["--seed", "-1"], "--seed"), (["--model", "/nonexistent"], "/nonexistent"),
                 (["--model", "{junk}"], "tokenizer.json"), (["--dtype", "float16"], "invalid choice")],
    "make-tiny": [(["{junk}"], "refusing to write a checkpoint into it"), (["--format", "x", "{junk}/new"], "invalid choice"),
                  (["--seed", "x", "{junk}/n2"], "--seed"), (["{junk}/notjson.json"], "not an empty directory")],
    "make-slice": [(["{junk}"], "refusing to write a checkpoint into it"), (["--layers", "1", "{junk}/s1"], "--layers 1"),
                   (["--layers", "x", "{junk}/s2"], "--layers"), (["--device", "bogus", "{junk}/s3"], "not a torch device"),
                   (["--format", "x", "{junk}/s4"], "invalid choice"), (["--layers", "49", "{junk}/s5"], "1..48")],
    "preflight": [(["/nonexistent"], "not a directory"), (["{junk}/fifo"], "not a directory"), (["--max-lines", "-1", "{junk}"], "--max-lines"),
                  ([], "required"), (["{junk}", "--manifest", "{junk}/fifo"], "not a regular file"),
                  (["{junk}", "--manifest", "{junk}/nan.json"], "not a readable manifest"),
                  (["{junk}", "--full", "--headers-only"], "not allowed with")],
    "preflight --node": [(["--node", "--tp", "0"], "--tensor-parallel-size"), (["--node", "--kv-cache-memory-bytes", "0"], "--kv-cache-memory-bytes"),
                         (["--node", "--manifest", "/nonexistent"], "--manifest"), (["--node", "--manifest", "{junk}/notjson.json"], "--manifest"),
                         (["--node", "--max-model-len", "-5"], "--max-model-len"), (["--node", "--oom-threshold", "1e29"], "--oom-threshold"),
                         (["--node", "--max-jobs", "0"], "--max-jobs"), (["--node", "--node-ip", "999.1.1.1"], "not an IPv4 address"),
                         (["--node", "--oom-threshold", "130g"], "not below"), (["--node", "--kv-cache-memory-bytes", str(10**29)], "a DGX Spark has")],
    "budget": [(["--tp", "0"], "--tensor-parallel-size"), (["--tp", "3"], "does not divide"), (["--kv-cache-memory-bytes", "0"], "--kv-cache-memory-bytes"),
               (["--kv-cache-memory-bytes", "1e29"], "1e29"),
               (["--kv-cache-memory-bytes", str(10**29)], "more than the 121.0 GiB a DGX Spark has"), (["--gpu", "h200", "--kv-cache-memory-bytes", str(10**29)], "exceed the H200's"),
               (["--max-model-len", "x"], "'x'"), (["--block-size", "0"], "--block-size"),
               (["--max-num-seqs", "0"], "--max-num-seqs"), (["--model", "/nonexistent"], "no config.json"), (["--model", "{junk}/fifo"], "not a regular file")],
    "scripts": [(["--out", "{junk}/s"] + NODE + ["--tp", "0"], "--tp"), (["--out", "{junk}/s"] + NODE + ["--oom-interval", "inf"], "not a finite number"),
                (["--out", "{junk}/s"] + NODE + ["--port", "70000"], "--port"), (["--out", "{junk}/s"] + NODE + ["--kv-cache-memory-bytes", "0"], "--kv-cache-memory-bytes"),
                (["--out", "{junk}/s", "--worker-ssh=-oProxyCommand=touch /tmp/pwned"] + NODE, "starts with '-'"),
                (["--out", "{junk}/s"] + NODE + ["--served-model-name", "m\n"], "control character"),
                (["--out", "{junk}/notjson.json"] + NODE, "--out")],
    "bench": [(["smoke", "--timeout", "0"], "--timeout"), (["smoke", "--timeout", "inf"], "not a finite number"), (["sweep", "--repeats", "0"], "--repeats"),
              (["single", "--prompt-len", "0"], "--prompt-len"), (["trace", "/nonexistent", "--model", "m"], "No such file"),
              (["trace", "{junk}/fifo", "--model", "m"], "not a regular file"), (["trace", "{junk}/notjson.json", "--model", "m"], "not JSON"),
              (["make-trace", "{junk}/t.jsonl", "--n", "0"], "--n"), (["make-trace", "{junk}/t.jsonl", "--rate", "-1"], "--rate"),
              (["make-trace", "{junk}/t.jsonl", "--input-len", "5,1"], "MIN <= MAX"), (["single", "--url", "http://127.0.0.1:1"], "http://127.0.0.1:1/v1/models"),
              (["single", "--url", "http://[::1"], "--url"), (["smoke", "--url", "ftp://x"], "--url"), (["trace", "t", "--concurrency", "0"], "--concurrency")],
    "dynamo": [(["--dry-run", "--tp", "0"], "--tp"), (["--dry-run", "--tp", "3"], "--tp 3"), (["--dry-run", "--gpu", "x"], "invalid choice"),
               (["--dry-run", "--gpu-memory-utilization", "inf"], "not a finite number"), (["--dry-run", "--name", "a$b"], "--name"),
               (["--dry-run", "--replicas", "-1"], "--replicas"), (["--tp", "2"], "--out DIR is required")],
}
CASES = [(name, argv, msg) for name, cases in BAD.items() for argv, msg in cases]


@pytest.mark.parametrize("name, argv, msg", CASES, ids=[f"{n}:{' '.join(a)[:40]}" for n, a, _ in CASES])
def test_bad_values_end_in_one_line(name, argv, msg, junk):
    argv = [a.replace("{junk}", str(junk)) for a in argv]
    rc, out, err = run(name.split()[:1] + argv)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err and "internal error" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("solar-open2 "), err                         # argparse's usage lines may come before it
    assert msg in last, (msg, err)


def _parsers():
    "Every subcommand's argparse parser (and bench's modes), caught as `--help` builds them."
    grab, orig, orig_help = {}, argparse.ArgumentParser.parse_args, argparse.ArgumentParser.print_help
    def fake(self, *a, **kw):
        grab[self.prog] = self; raise SystemExit(0)
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.print_help = fake   # a subcommand may print its help itself
    try:
        for name in list(COMMANDS) + ["preflight --node"]:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try: main(name.split() + ["--help"])
                except SystemExit: pass
    finally: argparse.ArgumentParser.parse_args, argparse.ArgumentParser.print_help = orig, orig_help
    out = {}
    for prog, p in grab.items():
        out[prog] = p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction): out.update({sp.prog: sp for sp in a.choices.values()})
    return out


def test_every_option_has_help_and_its_default():
    ps = _parsers()
    assert {"solar-open2 " + n for n in COMMANDS} | {"solar-open2 preflight --node"} <= set(ps)
    for prog, p in ps.items():
        text = p.format_help()
        for a in p._actions:
            if not a.option_strings or a.dest == "help" or a.help == argparse.SUPPRESS: continue
            assert a.help, f"{prog} {a.option_strings[0]} has no help"
            shown = "default" in a.help or "%(default)" in a.help or issubclass(p.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
            if a.default not in (None, False) and a.const is None: assert shown, f"{prog} {a.option_strings[0]}: default {a.default!r} not shown"
        assert "8e9" not in text and "28e9" not in text, f"{prog}: a size the tools reject"
    assert "--node" in ps["solar-open2 preflight"].format_help()


def test_help_examples_parse():
    "Every `solar-open2 ...` line of a help text is accepted by the parser of its subcommand."
    ps, n = _parsers(), 0
    for p in list(ps.values()):
        for line in (p.epilog or "").splitlines():
            words = line.split()
            if words[:1] != ["solar-open2"]: continue
            ps["solar-open2 " + words[1]].parse_args(words[2:]); n += 1
    assert n >= 5, n

def test_help_and_version_exit_0():
    from solar_open2 import __version__
    assert run(["--version"])[:2] == (0, f"solar-open2 {__version__}\n")
    for name in COMMANDS:
        rc, out, _ = run([name, "--help"]); assert rc == 0 and out.startswith("usage: solar-open2"), (name, out[:200])


def test_closed_pipe_ends_quietly():
    "`solar-open2 budget | head`: the reader is gone before the first write; no traceback, the shell's 141."
    p = subprocess.Popen([sys.executable, "-c", "import sys; from solar_open2.cli import main; sys.exit(main(['budget']))"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    p.stdout.close()
    err = p.stderr.read().decode(); rc = p.wait(timeout=120)
    assert rc == 141 and "Traceback" not in err and "BrokenPipe" not in err, (rc, err)
