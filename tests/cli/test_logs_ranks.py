"""`orch logs` across attempts and, for a multi-node job, across ranks (one log per rank)."""

from __future__ import annotations

import subprocess
import sys

from orchestrator.contract import attempt_log, parse_attempt_log
from orchestrator.home.paths import Home
from orchestrator.store import Store


def test_attempt_log_names_parse_back():
    assert parse_attempt_log(attempt_log(3)) == (3, 0)
    assert parse_attempt_log(attempt_log(3, 2)) == (3, 2)
    assert parse_attempt_log("attempt-3.exit") is None and parse_attempt_log("attempt-x.log") is None


def test_logs_print_every_attempt_and_every_rank_in_order_with_the_rank_named(tmp_path):
    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    job = store.submit(name="ddp", kind="builtin", gpus=0, priority=0, retries=0, spec={}, spec_path="", now=1.0)
    run = home.run_dir(job.id)
    run.mkdir(parents=True)
    (run / attempt_log(1)).write_text("a1 rank0\n")
    (run / attempt_log(1, 1)).write_text("a1 rank1 line1\na1 rank1 line2\n")
    (run / attempt_log(2)).write_text("a2 rank0\n")
    (run / attempt_log(2, 1)).write_text("a2 rank1\n")
    (run / attempt_log(10)).write_text("a10 rank0\n")  # numeric order, not name order
    res = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home.root), "logs", str(job.id)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "a1 rank0",
        "[rank 1] a1 rank1 line1",
        "[rank 1] a1 rank1 line2",
        "a2 rank0",
        "[rank 1] a2 rank1",
        "a10 rank0",
    ]
    last = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home.root), "logs", str(job.id), "-n", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert last.stdout.splitlines() == ["[rank 1] a2 rank1", "a10 rank0"]
