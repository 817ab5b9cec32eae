"""`orch status --json`, `orch show` and `orch show --json` name a Ray attempt's submission id and
node (views/ray_where.py), from the job row and the run folder alone: no Ray head, no daemon. A
real store and real CLI subprocesses; the Ray cluster tests check the same keys against a real
cluster (tests/ray_executor)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.contract import attempt_ray_info, ray_submission_id, write_exit_record, write_json_atomic
from orchestrator.home.paths import Home
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState
from orchestrator.store import Store

ORCH = [sys.executable, "-m", "orchestrator.cli"]
NODE_1, NODE_2 = "a1" * 28, "b2" * 28  # Ray's node ids are 56 hex digits


def orch(home: Path, *args: str) -> str:
    res = subprocess.run([*ORCH, "--home", str(home), *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def command_job(store: Store, name: str, *, gpus: int, now: float):
    """A command job as `orch submit` records it (the views read rows and run folders only)."""
    return store.submit(
        name=name,
        kind="command",
        gpus=gpus,
        priority=0,
        retries=0,
        spec={"command": ["x"], "workdir": "/tmp"},
        spec_path="",
        now=now,
    )


def test_status_and_show_name_each_ray_attempts_submission_id_and_node(tmp_path):
    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    now = time.time()
    job = command_job(store, "on-ray", gpus=1, now=now - 60)
    run_dir = home.run_dir(job.id)
    run_dir.mkdir(parents=True)
    # attempt 1 ran on worker-a and was lost; attempt 2 runs on worker-b
    store.transition(
        job.id,
        JobState.RUNNING,
        EventKind.STARTED,
        now - 50,
        updates={"attempt": 1, "started_at": now - 50},
        begin_attempt=AttemptStart(1),
    )
    write_json_atomic(run_dir / attempt_ray_info(1), {"host": "worker-a", "node_id": NODE_1})
    store.transition(
        job.id, JobState.QUEUED, EventKind.RETRYING, now - 30, end_attempt=AttemptEnd(now - 30, AttemptOutcome.LOST)
    )
    store.transition(
        job.id,
        JobState.RUNNING,
        EventKind.RESUMED,
        now - 20,
        updates={"attempt": 2, "started_at": now - 20},
        begin_attempt=AttemptStart(2),
    )
    sid2 = ray_submission_id(job.uid, 2)
    where = f"Ray {sid2}: RUNNING on node {NODE_2[:8]} (worker-b)"
    store.update(
        job.id,
        now,
        executor="ray",
        executor_ref={"submission_id": sid2, "state": "RUNNING", "node_id": NODE_2, "where": where},
    )
    write_json_atomic(run_dir / attempt_ray_info(2), {"host": "worker-b", "node_id": NODE_2})

    status = json.loads(orch(home.root, "status", "--json"))
    row = next(r for r in status if r["id"] == job.id)
    assert row["ray"] == {"submission_id": sid2, "state": "RUNNING", "node_id": NODE_2}, row
    assert sid2 in orch(home.root, "status") and f"node {NODE_2[:8]}" in orch(home.root, "status")

    shown = json.loads(orch(home.root, "show", str(job.id), "--json"))
    assert [a.get("ray") for a in shown["attempts"]] == [
        {"submission_id": ray_submission_id(job.uid, 1), "node_id": NODE_1, "host": "worker-a"},
        {"submission_id": sid2, "node_id": NODE_2, "host": "worker-b"},
    ], shown["attempts"]
    text = orch(home.root, "show", str(job.id))
    assert f"Ray {ray_submission_id(job.uid, 1)} on node {NODE_1[:8]} (worker-a)" in text, text
    assert f"Ray {sid2} on node {NODE_2[:8]} (worker-b)" in text, text


def test_a_ray_attempt_stopped_while_pending_is_named_without_a_node_and_a_local_one_not_at_all(tmp_path):
    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    now = time.time()
    jobs = []
    for name in ("pending-on-ray", "local"):
        job = command_job(store, name, gpus=0, now=now)
        store.transition(
            job.id,
            JobState.RUNNING,
            EventKind.STARTED,
            now,
            updates={"attempt": 1, "started_at": now},
            begin_attempt=AttemptStart(1),
        )
        home.run_dir(job.id).mkdir(parents=True)
        jobs.append(job)
    # the Ray executor writes this exit record itself for a job it stopped before Ray ran it
    write_exit_record(home.run_dir(jobs[0].id), 1, None, 15, now, now, ray_status="stopped while pending in Ray")
    write_exit_record(home.run_dir(jobs[1].id), 1, 0, None, now, now)
    for job in jobs:
        store.transition(
            job.id,
            JobState.CANCELLED,
            EventKind.CANCELLED,
            now,
            end_attempt=AttemptEnd(now, AttemptOutcome.CANCELLED, exit_signal=15),
        )
    pending = json.loads(orch(home.root, "show", str(jobs[0].id), "--json"))["attempts"][0]
    assert pending["ray"] == {"submission_id": ray_submission_id(jobs[0].uid, 1), "node_id": None, "host": None}
    assert "(never ran on a node)" in orch(home.root, "show", str(jobs[0].id))
    local = json.loads(orch(home.root, "show", str(jobs[1].id), "--json"))["attempts"][0]
    assert "ray" not in local, local
    assert "ray" not in json.loads(orch(home.root, "show", str(jobs[1].id), "--json"))
