"""orch's benchmarks: each module is one measurement, run from the repository root as
`python -m benchmarks.NAME` (docs/benchmarks.md). common.py holds what several share. Nothing in
orch imports this package, and the wheel does not carry it."""
