"""An attempt's secret file: how a cluster job (Ray, Slurm) gets the values it must never see in the
cluster's job table (Ray's runtime_env, which the dashboard serves; a Slurm job's environment). The
daemon writes `attempt-<n>.secrets.json` into the run folder, which every node shares; the job-side
step (ray/step.py, slurm/step.py) reads it, deletes it and starts the command with the values in its
environment; the daemon removes it again when it sees the attempt end, whether the step ran or not.

Owner-only from its first byte: the temp file is created with mode 0600 (os.open with O_EXCL, so
the umask can only take bits away), filled, fsynced and renamed into place, so no reader ever
sees it world-readable or half written. Standard library only: it sits beside every job."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

from ..contract import TEMP_MARK, attempt_secrets, fsync_dir

MODE = 0o600


def secret_file(run_dir: Path, n: int) -> Path:
    """Attempt n's secret file in its run folder (the one name both sides use)."""
    return Path(run_dir) / attempt_secrets(n)


def write_secret_file(run_dir: Path, n: int, values: Mapping[str, str]) -> Path:
    """Write {name: value} for attempt n, owner-only and all or nothing (see the module's words).
    On an error nothing is left behind: no temp file, and no secret file where there was none."""
    path = secret_file(run_dir, n)
    tmp = path.with_name(f"{TEMP_MARK}{os.getpid()}-{path.name}")
    data = json.dumps(dict(values)).encode()
    try:
        tmp.unlink()  # a temp file left by a daemon that died here (same pid after a reboot)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, MODE)
    try:
        try:
            os.fchmod(fd, MODE)  # a filesystem that ignored the mode at create gets it now, still empty
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
    return path


def take_secret_file(run_dir: Path, n: int) -> dict[str, str]:
    """The job side: attempt n's secrets, and the file deleted at once. Raises OSError when the file
    is missing, and ValueError when it is not a table of strings (never with its content)."""
    path = secret_file(run_dir, n)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read()
    finally:
        remove_secret_file(run_dir, n)
    try:
        values = json.loads(raw)
    except ValueError:
        raise ValueError(f"{path.name} is not JSON") from None
    if not isinstance(values, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise ValueError(f"{path.name} is not a table of strings")
    return values


def remove_secret_file(run_dir: Path, n: int) -> bool:
    """Gone, if it was there (the daemon calls it whenever it sees the attempt end: idempotent).
    False only when it is there and could not be removed."""
    try:
        secret_file(run_dir, n).unlink()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True
