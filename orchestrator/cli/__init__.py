"""The `orch` process: the typer app (app.py) and what only the client uses — the views behind
status/show/cost, their rendering, logs, `orch run` in the foreground, the notify check."""

from .app import app, main

__all__ = ["app", "main"]
