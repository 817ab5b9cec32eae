"""The `orch` process: the typer app (app.py, its shared context in context.py) and what only the
client uses — the views behind status/show/cost, their rendering, logs, `orch run` in the
foreground, the notify check."""


def main() -> None:
    """The `orch` entry point (imports the verbs only when called)."""
    from .app import main as run_app

    run_app()


__all__ = ["main"]
