"""An error the CLI did not expect: one line on stderr and the full report in a file only its owner
may read, secrets masked. A traceback on the terminal is never shown: its locals (and even its
messages) can carry a webhook key or a password, and it is 150 lines a user cannot act on."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

REPORTS_FOLDER = "crash-reports"  # in $ORCH_HOME


def report_text(exc: BaseException, argv: list[str]) -> str:
    """The traceback without locals, the command line, every known secret masked."""
    body = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return _masked(f"orch {' '.join(argv)}\n{time.strftime('%Y-%m-%d %H:%M:%S %z')}\n\n{body}")


def _masked(text: str) -> str:
    from ..redaction import environ_secrets, redact  # the one masker, and its one list of secret variables

    # a password has no `key=` in front of it for the patterns to find: the variables' values too
    return redact(text, environ_secrets(os.environ))


def write_report(text: str, home_root: Optional[Path]) -> tuple[Optional[Path], Optional[str]]:
    """(where the report is, why it is not under the home). Under $ORCH_HOME/crash-reports when
    that folder can be made ours; else in a fresh private temp folder; else nowhere."""
    name = f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    home_problem: Optional[str] = None
    if home_root is not None:
        try:
            folder = home_root / REPORTS_FOLDER
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise NotADirectoryError(0, f"{folder} is not a folder")
            folder.mkdir(mode=0o700, exist_ok=True)
            return _write_private(folder / name, text), None
        except OSError as exc:
            home_problem = f"{home_root} is unusable: {exc.strerror or exc}"
    else:
        home_problem = "ORCH_HOME is unusable"
    try:
        folder = Path(tempfile.mkdtemp(prefix="orch-error-"))  # 0700, made by us, never reused
        return _write_private(folder / name, text), home_problem
    except OSError:
        return None, home_problem


def _write_private(path: Path, text: str) -> Path:
    # O_EXCL: never write through a file or link someone else put there first.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def one_line(exc: BaseException, report: Optional[Path], home_problem: Optional[str]) -> str:
    """What the user sees: the error's kind and message (masked), and where the rest is."""
    message = _masked(str(exc).splitlines()[0] if str(exc) else "")
    head = f"orch: unexpected error: {type(exc).__name__}" + (f": {message}" if message else "")
    if report is None:
        return f"{head} (no report written: {home_problem}; nowhere private to write it)"
    where = f"the full report is in {report} ; please attach it when you report this"
    if home_problem:
        where += f" (it is not under ORCH_HOME: {home_problem})"
    return f"{head}; {where}"
