"""`orch adopt` says what each job will run (name, kind, command and folder), asks on a terminal,
takes --yes from a script, and without a terminal and without --yes refuses in one line,
adopting nothing."""

from __future__ import annotations

import os
import pty
import sqlite3
import subprocess
import sys

import pytest

from mirror_setup import make_origin


@pytest.fixture
def origin(tmp_path_factory):
    return make_origin(tmp_path_factory.mktemp("origin"))


def _rows(home) -> int:
    if not (home / "orch.db").exists():
        return 0
    conn = sqlite3.connect(home / "orch.db")
    try:
        return conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    finally:
        conn.close()


def test_without_a_terminal_or_yes_it_shows_the_command_and_refuses(sandbox, origin):
    store_dir, uid = origin
    sandbox.orch("status").clean(0)
    sandbox.mark()
    ran = sandbox.orch("adopt", f"file://{store_dir}", "--all").clean(2)
    assert "victim" in ran.out and "command" in ran.out and sys.executable in ran.out, ran.out
    refusal = [line for line in ran.err.splitlines() if line.strip()]
    assert len(refusal) == 1 and "--yes" in refusal[0] and "terminal" in refusal[0], ran.err
    assert _rows(sandbox.home) == 0
    sandbox.assert_nothing_outside_home()  # no lease taken either


def _on_a_terminal(sandbox, args, answer: bytes) -> tuple[int, str]:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(sandbox.home), *args],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=sandbox.env(),
    )
    os.close(follower)
    os.write(leader, answer)
    out, _ = proc.communicate(timeout=90)
    os.close(leader)
    return proc.returncode, out.decode()


def test_on_a_terminal_no_adopts_nothing_and_yes_adopts(sandbox, origin):
    store_dir, uid = origin
    sandbox.orch("status").clean(0)
    sandbox.mark()
    rc, out = _on_a_terminal(sandbox, ["adopt", f"file://{store_dir}", "--job", uid], b"n\n")
    assert rc == 2 and "adopt and run these jobs here? [y/N]" in out and "not adopted" in out, out
    assert "Traceback" not in out
    assert _rows(sandbox.home) == 0
    sandbox.assert_nothing_outside_home()
    rc, out = _on_a_terminal(sandbox, ["adopt", f"file://{store_dir}", "--job", uid], b"y\n")
    assert rc == 0 and f"adopted {uid[:12]} (victim) as job 1" in out, out
    assert _rows(sandbox.home) == 1
