"""Exit codes of the job-process contract and the exceptions that lead to them. Imports nothing
heavy: `python -m training.run` installs the early SIGTERM handler before torch is imported."""

from __future__ import annotations

import signal

EX_OK, EX_FAIL, EX_TEMPFAIL, EX_OOM = 0, 1, 75, 76


class RunError(Exception):
    """A failure with a message for the user (printed as the attempt's last line)."""


class EarlyStop(SystemExit):
    """SIGTERM outside training (imports, model load, tokenization, export): exit 75."""

    def __init__(self) -> None:
        super().__init__(EX_TEMPFAIL)


def _raise_early_stop(signum, frame):
    raise EarlyStop()


def install_early_sigterm() -> None:
    signal.signal(signal.SIGTERM, _raise_early_stop)
