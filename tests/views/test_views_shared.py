"""One view of a job for every reader (issue 36): `orch status --json`, `orch show --json` and the
dashboard's JSON (through its real HTTP server) come from views/queue_view.py and
views/job_view.py, so the dashboard has the deadline and mirror-lag notes, the bill and the tracker
lines that `orch show` prints. Real store, real CLI subprocesses, a real loopback server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "look"))
from look_browser import DashboardProcess  # noqa: E402

from orchestrator.contract import TRACKING, write_json_atomic  # noqa: E402
from orchestrator.home.paths import Home  # noqa: E402
from orchestrator.model.records import AttemptStart  # noqa: E402
from orchestrator.model.states import EventKind, JobState  # noqa: E402
from orchestrator.store import Store  # noqa: E402

ORCH = [sys.executable, "-m", "orchestrator.cli"]
SECRET_URL = "http://alice:hunter2hunter2@mlflow.example:5000"


def orch_json(home: Path, *args: str) -> object:
    res = subprocess.run(
        [*ORCH, "--home", str(home), *args], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture
def busy_home(tmp_path) -> tuple[Path, int, int]:
    """A running job with a deadline, a tracker run and a few seconds billed; a queued job whose
    mirror lags (an upload waiting, the store unreachable)."""
    home = Home(tmp_path / "home").ensure()
    (home.root / "config.toml").write_text(
        '[pricing]\ncurrency = "CNY"\ngpu_hour = 2.0\ninstance_hour = 0.5\n'
        '[storage]\nurl = "file:///tmp/never-used-bucket"\n'
    )
    store = Store(home.db)
    now = time.time()
    spec = {"command": ["python", "train.py"], "workdir": "/tmp", "deadline": "2099-01-01T00:00:00+00:00"}
    running = store.submit(
        name="with-deadline", kind="command", gpus=0, priority=0, retries=0, spec=spec, spec_path="", now=now - 60
    )
    store.transition(
        running.id,
        JobState.RUNNING,
        EventKind.STARTED,
        now - 50,
        updates={"attempt": 1, "started_at": now - 50},
        begin_attempt=AttemptStart(1),
    )
    store.charge_job(running.id, 40.0, 0.2, 0.0)
    run_dir = home.run_dir(running.id)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        run_dir / "progress.json",
        {"step": 10, "total_steps": 100, "epoch": 0, "metrics": {}, "samples_per_s": 5.0, "updated_at": now},
    )
    write_json_atomic(
        run_dir / TRACKING,
        {"backends": {"mlflow": {"run_id": "r-123", "url": SECRET_URL, "mode": "online", "project": "p"}}},
    )
    lagging = store.submit(
        name="lagging",
        kind="command",
        gpus=0,
        priority=0,
        retries=0,
        spec={"command": ["x"], "workdir": "/tmp"},
        spec_path="",
        now=now - 30,
    )
    store.mirror_set(lagging.id, lagging.uid, error="connection refused", error_since=now - 120)
    store.upload_enqueue(lagging.id, lagging.uid, "/tmp/x.ckpt", "step-00000010.ckpt", 10, False, now - 100)
    store.close()
    return home.root, running.id, lagging.id


def seconds_blurred(text: str) -> str:
    return re.sub(r"\d+s\b", "Ns", text)


def api(server: DashboardProcess, path: str) -> dict:
    with urllib.request.urlopen(server.local(path), timeout=30) as resp:
        return json.loads(resp.read())


def test_status_and_the_dashboard_queue_are_one_view(busy_home):
    root, running, lagging = busy_home
    cli_rows = {r["id"]: r for r in orch_json(root, "status", "--json")}  # type: ignore[union-attr]
    server = DashboardProcess(root)
    try:
        page_rows = {r["id"]: r for r in api(server, "/api/queue")["jobs"]}
    finally:
        server.close()
    for job_id in (running, lagging):
        cli, page = cli_rows[job_id], page_rows[job_id]
        for key in ("id", "name", "state", "attempt", "gpus", "step", "total_steps", "cost", "sweep"):
            assert cli[key] == page[key], (key, cli[key], page[key])
        assert seconds_blurred(cli["reason"]) == seconds_blurred(page["reason"])  # read a moment apart
    # the deadline note and the mirror's lag, which the dashboard lacked
    assert "deadline" in page_rows[running]["reason"] and "projected_finish" in page_rows[running]
    assert page_rows[running]["deadline_at_risk"] is False
    assert "mirror lagging" in page_rows[lagging]["reason"] and page_rows[lagging]["mirror_lag"]


def test_show_and_the_dashboard_job_page_are_one_view(busy_home):
    root, running, lagging = busy_home
    cli = orch_json(root, "show", str(running), "--json")
    server = DashboardProcess(root)
    try:
        page = api(server, f"/api/job/{running}")
        lag_page = api(server, f"/api/job/{lagging}")
    finally:
        server.close()
    assert isinstance(cli, dict)
    # the documented --json keys, unchanged
    for key in ("id", "name", "state", "attempt", "gpus", "step", "total_steps", "eta_s", "runtime_s", "cost"):
        assert key in cli and cli[key] == page[key], key
    for key in ("spec", "events", "attempts", "checkpoints", "result"):
        assert key in cli and key in page, key
    # what `orch show` prints and the dashboard now has too
    assert page["bill"] == cli["bill"] and page["bill"]["billed_s"] > 0
    assert page["currency"] == cli["currency"] == "CNY"
    assert page["deadline"] == cli["deadline"] and "projected_finish" in page
    assert page["tracking"]["backends"]["mlflow"]["run_id"] == "r-123"
    assert "hunter2hunter2" not in json.dumps(page)  # the tracker URL's password stays off the page
    assert cli["mirror"]["url"] == page["mirror"]["url"]
    assert lag_page["mirror"]["error"] == "connection refused" and lag_page["mirror"]["pending"] == 1
