"""The engine benchmark's command line: the `log` and `layers` subcommands, else one of the phases."""
import sys

from benchmarks.engine.perf.cli import parse_args
from benchmarks.engine.perf.log import cli_log
from benchmarks.engine.perf.results import read_ab_runs, run_merge, write_ab
from benchmarks.engine.perf.run import run_ab, run_all, run_phase
from benchmarks.engine.perf.trace import cli_layers

def main(argv:list|None=None)->int:
    "Dispatch: `log` and `layers` subcommands, else one of the phases."
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["log"]: return cli_log(argv[1:])
    if argv[:1] == ["layers"]: return cli_layers(argv[1:])
    a = parse_args(argv)
    if a.phase == "merge": return run_merge(a)
    if a.phase == "all": return run_all(a, argv)
    if a.phase == "ab": return run_ab(a, argv)
    if a.phase == "ab-merge": return write_ab(a, argv, read_ab_runs(a))
    return run_phase(a, a.phase, argv)
