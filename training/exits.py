"""Exit codes of the job-process contract and the exceptions that lead to them. Imports nothing
heavy: `python -m training.run` installs the early SIGTERM handler before torch is imported."""

from __future__ import annotations

import os
import signal
import sys

from orchestrator.contract import EX_CHECKPOINTED, EX_CONFIG, EX_FAIL, EX_OK, EX_OOM  # noqa: F401 (re-exported)


class RunError(Exception):
    """A failure with a message for the user (printed as the attempt's last line)."""


class ConfigError(RunError):
    """A data or configuration error: the same input fails the same way on every attempt (an empty
    file, a missing column, LoRA modules the model lacks). Exit 78 with job_error.json: the job
    fails at once instead of being retried. Raise it only when no retry could succeed."""


class EarlyStop(SystemExit):
    """SIGTERM outside training (imports, model load, tokenization, export): exit 75."""

    def __init__(self) -> None:
        super().__init__(EX_CHECKPOINTED)


# True in `python -m training.run`: the process is ours, so an early SIGTERM ends it at once. An
# exception raised from a signal handler lands wherever the main thread happens to be, and library
# code with a bare `except:` (multiprocess's own import fallback, seen here) swallows it and
# fails with an unrelated error instead of exiting 75.
EXIT_AT_ONCE = False

EARLY_MESSAGE = f"[orch] SIGTERM before training started; exiting {EX_CHECKPOINTED} (nothing new to save)"


def _early_stop(signum, frame):
    if EXIT_AT_ONCE:
        try:
            sys.stderr.write(EARLY_MESSAGE + "\n")
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            os._exit(EX_CHECKPOINTED)
    raise EarlyStop()


def install_early_sigterm() -> None:
    signal.signal(signal.SIGTERM, _early_stop)
