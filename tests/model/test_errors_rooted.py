"""Every error orch raises on purpose is an OrchError (issue 28), with one word for "trying again
later can help": `retryable`. The rule is read from the source, so a new error class cannot slip
outside the hierarchy."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from orchestrator.model.errors import OrchError

REPO = Path(__file__).resolve().parents[2]


def _looks_like_error(base: ast.expr) -> bool:
    """A base named like an exception (`...Error`, `...Exception`, `Conflict`...): only those
    modules are imported, and each class found is then checked for being an exception at all."""
    name = ast.unparse(base).rsplit(".", 1)[-1]
    return name.endswith(("Error", "Exception", "Warning", "Exit")) or name in ("Refused", "Conflict")


def error_classes() -> list[type]:
    found = []
    for path in sorted(p for pkg in ("orchestrator", "notifiers") for p in (REPO / pkg).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and any(map(_looks_like_error, n.bases))]
        if not names:
            continue
        module = importlib.import_module(
            ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        )
        found += [
            c for c in (getattr(module, n) for n in names) if isinstance(c, type) and issubclass(c, BaseException)
        ]
    return found


def test_every_error_class_is_an_orch_error():
    classes = error_classes()
    names = {c.__name__ for c in classes}
    assert {"SlurmError", "ManifestError", "NotifyError", "StorageError", "TooLarge"} <= names
    assert [c.__qualname__ for c in classes if not issubclass(c, OrchError)] == []


def test_retryable_is_the_one_word():
    from notifiers.base import NotifyError
    from orchestrator.executors.slurm.script import SlurmError
    from orchestrator.objectstore.remote import StorageError

    assert StorageError("down").retryable and not StorageError("bad url", retryable=False).retryable
    assert NotifyError("ch", "HTTP 503", retryable=True).retryable
    assert OrchError("x").retryable is False
    assert isinstance(SlurmError("sbatch: refused"), OSError)  # an executor's start raises OSError
