"""The `orch` process: the typer app (app.py, its shared context in context.py) and what only the
client uses — logs, the doctor, the notify check. The verbs parse and print; `orch run`'s
supervisor is orchestrator/foreground/, the views behind status/show/cost are orchestrator/views/."""


def main() -> None:
    """The `orch` entry point (imports the verbs only when called)."""
    from .app import main as run_app

    run_app()


__all__ = ["main"]
