"""Programs nobody edited for orch (LLaMA-Factory, TRL, axolotl, a Lightning script), run with
job.toml `instrument`: the bootstrap on their PYTHONPATH (boot/) and what it attaches (attach.py)."""
