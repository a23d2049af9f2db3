"""The command line's help texts, collected the way a user reads them: `solar-open2 --help`, then every subcommand
listed there, then the sub-subcommands of argparse's `{a,b,c}` usage lines (tests/test_commands.py,
tests/test_user_text.py)."""
from __future__ import annotations
import contextlib, io, re


def cli_help(args: list[str]) -> tuple[int, str]:
    "`solar-open2 ARGS --help` in this process: (exit code, text)."
    from solar_open2.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try: rc = main([*args, "--help"] if args else ["--help"])
        except SystemExit as e: rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return rc or 0, out.getvalue()


def subcommands(top_help: str) -> list[str]:
    "The names listed under `subcommands:` in `solar-open2 --help`."
    names, on = [], False
    for line in top_help.splitlines():
        if not line.startswith(" ") and re.search(r"subcommands?:\s*$", line, re.IGNORECASE): on = True; continue
        if on:
            m = re.match(r"^  ([a-z][\w-]*)\s", line)
            if m: names.append(m.group(1))
            elif line.strip() and not line.startswith(" "): on = False
    return names


def nested(help_text: str) -> list[str]:
    "Sub-subcommands: the `{a,b,c} ...` of argparse's usage line (an option's `[--x {a,b}]` choices are not)."
    usage = help_text.split("\n\n", 1)[0]
    m = re.search(r"(?<![\[\w-] )\{([\w,-]+)\} \.\.\.", usage)
    return m.group(1).split(",") if m else []


def all_helps() -> dict[tuple, str]:
    "{(subcommand, ...): help text} for the top level and every subcommand, nested ones included."
    rc, top = cli_help([])
    assert rc == 0, top
    out, todo = {(): top}, [(s,) for s in subcommands(top)]
    while todo:
        path = todo.pop(0)
        rc, text = cli_help(list(path))
        assert rc == 0, f"solar-open2 {' '.join(path)} --help: exit {rc}\n{text}"
        out[path] = text
        if len(path) < 3: todo += [path + (n,) for n in nested(text) if path + (n,) not in out]
    return out
