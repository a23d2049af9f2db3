"""Kernel benchmarks on one GPU (and two on the CPU): each times one of the plugin's kernels against what it replaces,
at the real per-rank shapes, after checking it; `python -m benchmarks.kernels.NAME --help` for each."""
