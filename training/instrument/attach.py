"""What the bootstrap does once a Trainer module has been imported: check the mode the job asked for
(ORCH_INSTRUMENT) and the framework's version, then attach orch's callback to that Trainer class.
A program orch cannot instrument as asked stops here with one line and exit 78 (job_error.json):
the same program would fail the same way on every attempt, and running it without its resume would
lose its work at the first preemption."""

from __future__ import annotations

import importlib.metadata
import os
from types import ModuleType
from typing import NoReturn

from orchestrator.contract import (
    ENV_ATTEMPT,
    ENV_INSTRUMENT,
    EX_CONFIG,
    INSTRUMENT_DISTS_OF,
    JOB_ERROR,
    instrument_version_problem,
    write_json_atomic,
)

from training.scripts.job_side import run_dir, say

_UNIFIED_LIGHTNING = "lightning.pytorch.trainer.trainer"


def refuse(message: str) -> NoReturn:
    say(f"instrument: {message}")
    folder = run_dir()
    if folder is not None:
        attempt = os.environ.get(ENV_ATTEMPT, "")
        try:
            write_json_atomic(
                folder / JOB_ERROR,
                {"attempt": int(attempt) if attempt.isdigit() else None, "message": f"instrument: {message}"},
            )
        except OSError:
            pass
    raise SystemExit(EX_CONFIG)


def attach(module: ModuleType, framework: str) -> None:
    mode = os.environ.get(ENV_INSTRUMENT) or "off"
    if mode not in (framework, "auto"):
        return
    if module.__name__ == _UNIFIED_LIGHTNING:
        refuse(
            "the program trains with `lightning.pytorch`; orch instruments `pytorch_lightning` "
            '(the same Trainer under its standalone name): import that, or set instrument = "off"'
        )
    for dist in INSTRUMENT_DISTS_OF[framework]:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = getattr(module, "__version__", None) or "(unknown version)"
        problem = instrument_version_problem(dist, version)
        if problem:
            refuse(f'{problem}; install a supported one, or set instrument = "off"')
    try:
        if framework == "transformers":
            from training.instrument.hf_patch import instrument_trainer
        else:
            from training.instrument.lightning_patch import instrument_trainer
        instrument_trainer(module.Trainer)
    except Exception as exc:  # a Trainer of an unexpected shape: say so, never a traceback
        refuse(f"could not attach orch's callback to {module.__name__}.Trainer ({type(exc).__name__}: {exc})")
