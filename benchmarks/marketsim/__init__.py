"""The market benchmark's simulated world (benchmarks/market.py): an in-memory bucket, a spot market
read from an availability trace, machines that behave as orch's daemon does, and the paper's
baseline policies. Nothing here is imported by orch itself."""
