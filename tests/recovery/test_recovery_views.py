"""The jobs `orch watch` waits on a machine for, built once (views/recovery.py): `orch status` in the
controller's home and the dashboard list the same ones, from a real store, the dashboard through
the read-only store it serves from."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from orchestrator.cli.app import app
from orchestrator.dashboard.data import queue
from orchestrator.home.paths import Home
from orchestrator.spec.config import load_config
from orchestrator.store import Store

# (uid, state, waiting) for each state `orch watch` writes; only the first three wait for a machine.
ROWS = [
    ("a" * 16, "waiting", True),
    ("b" * 16, "launching", True),
    ("c" * 16, "left alone", True),
    ("d" * 16, "alive", False),
    ("e" * 16, "released", False),
    ("f" * 16, "finished", False),
]


def test_status_and_the_dashboard_list_the_same_jobs_waiting_for_a_machine(tmp_path):
    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    now = time.time()
    for uid, state, _ in ROWS:
        store.recovery_set(
            uid, now, name=f"job-{state}", url="file:///b", state=state, waiting_since=now - 90, launches=2, losses=1
        )  # each lost its machine once: it waits for a replacement
    store.close()

    shown = CliRunner().invoke(app, ["--home", str(home.root), "status"])
    assert shown.exit_code == 0, shown.output
    noted = [line for line in shown.output.splitlines() if line.startswith("recovery: ")]
    listed = queue(Store(home.db, read_only=True), home, load_config(None), now)["recovery"]

    waiting = [uid for uid, _, waits in ROWS if waits]
    assert [row["uid"] for row in listed] == waiting
    assert [line.split()[1] for line in noted] == [uid[:12] for uid in waiting]
    for line in noted:
        assert "for a replacement machine since" in line and "2 launch(es)" in line, line
