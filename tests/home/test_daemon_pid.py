"""One answer to "is a daemon running?" (issue 28): the CLI and the dashboard both ask the daemon's
lock, never the pid file alone, and a daemon starting while someone asks still starts."""

from __future__ import annotations

import fcntl
import os
import threading
import time

from orchestrator.dashboard.data import daemon_pid
from orchestrator.home.daemon_lock import DaemonLock, running_pid
from orchestrator.home.paths import Home


def test_a_stale_pid_file_is_no_daemon_for_the_cli_nor_the_dashboard(tmp_path):
    home = Home(tmp_path / "home").ensure()
    home.lock_file.touch()
    home.pid_file.write_text(f"{os.getpid()}\n")  # a daemon crashed; its pid now names a live process
    assert running_pid(home) is None
    assert daemon_pid(home) is None

    lock = DaemonLock(home)
    lock.acquire()
    try:
        assert running_pid(home) == os.getpid() == daemon_pid(home)
    finally:
        lock.release()
    assert daemon_pid(home) is None


def test_a_daemon_starting_while_the_lock_is_asked_about_still_starts(tmp_path):
    home = Home(tmp_path / "home").ensure()
    fd = os.open(home.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what running_pid holds for an instant

    def let_go() -> None:
        time.sleep(0.3)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    threading.Thread(target=let_go).start()
    lock = DaemonLock(home)
    lock.acquire()
    lock.release()


def test_a_daemon_records_the_python_its_jobs_run_with_for_the_preflight(tmp_path):
    import sys

    home = Home(tmp_path / "home").ensure()
    assert home.job_python("fallback") == "fallback"  # no daemon yet: the CLI's own
    lock = DaemonLock(home)
    lock.acquire()
    lock.release()
    assert home.daemon_python_file.read_text().strip() == sys.executable  # kept after the stop
    assert home.job_python("fallback") == sys.executable
    home.daemon_python_file.write_text(str(tmp_path / "gone" / "python") + "\n")  # that venv was removed
    assert home.job_python("fallback") == "fallback"
