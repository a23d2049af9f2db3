"""The project's measurements, as a package: `engine/` (the full-size engine benchmark, its plot, the GPU parity run,
the chat server check, the before/after comparison), `kernels/` (one benchmark per plugin kernel), `index`
(`results/INDEX.json`: every result file, what it holds, which figures are current), `common` (what they share).
Run everything from the repository root as `python -m benchmarks.<module>`; nothing here is imported by
`solar_open2`."""
