"""What the check cannot start without: the packages it imports, imported here (a broken install
fails at import, not at a name lookup), in the process that then runs the sections, so their
import is paid once. Standard library only, so it runs before anything that needs them."""

from __future__ import annotations

import importlib

NEEDED = (
    "torch",
    "pytorch_lightning",
    "transformers",
    "datasets",
    "pydantic",
    "apscheduler",
    "torchdata",
    "typer",
    "tomli_w",
    "safetensors",
)


def missing() -> list[str]:
    """One 'name (Error: first line)' per package that does not import."""
    gone = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            gone.append(f"{name} ({type(exc).__name__}: {first})")
    return gone
