"""`orch submit --estimate`'s question: the estimate printed (views/estimate.py), then the job
queued only on a yes. The estimate itself is jobs/estimate.py (the probe: jobs/probe.py)."""

from __future__ import annotations

import sys
from typing import Any

from ..views.estimate import estimate_text


def ask_after(data: dict[str, Any], yes: bool) -> None:
    """`orch submit --estimate`: print the estimate, then queue only on a yes (or --yes); with no
    terminal to ask on, nothing is queued (exit 1)."""
    import typer

    print(estimate_text(data), file=sys.stderr)
    if yes:
        return
    if not sys.stdin.isatty():
        print("not queued: no terminal to ask on (--yes queues it after the estimate)", file=sys.stderr)
        raise typer.Exit(1)
    if not typer.confirm("queue it?", default=False, err=True):
        print("not queued", file=sys.stderr)
        raise typer.Exit(1)
