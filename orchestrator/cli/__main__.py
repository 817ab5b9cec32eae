"""`python -m orchestrator.cli` = `orch` (the detached daemon is started this way)."""

from .app import main

main()
