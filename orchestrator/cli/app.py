"""`orch`: the command line. Thin: parse, call one function, render. Errors become exit codes
only in the group (context.OrchGroup): 2 bad input, 1 the request failed."""

from __future__ import annotations

# The verbs, registered on `app` by importing their modules (in the order `orch --help` lists them).
from . import job_commands, daemon_commands, tool_commands, sweep_commands, example_commands, launch  # noqa: F401
from .context import app

__all__ = ["app", "main"]


def main() -> None:
    app(prog_name="orch")


if __name__ == "__main__":  # `python -m orchestrator.cli.app`
    main()
