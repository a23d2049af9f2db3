"""`python -m benchmarks.engine.perf`: the engine benchmark (the package docstring says what it does)."""
import sys

from benchmarks.engine.perf.main import main

sys.exit(main())
