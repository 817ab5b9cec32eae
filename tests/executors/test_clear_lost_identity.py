"""clear_lost kills a lost attempt's processes, never a stranger's (issue 37, item 2). After a
reboot or once a pid is reused, the process-group number attempt-<n>.pid recorded may be anyone's:
the attempt's processes are found by their environment, and the recorded group only while it is
provably the attempt's (its leader the recorded process under this boot, or a member carrying the
attempt's environment). Real processes, started here: a stranger group whose id is recorded as the
lost attempt's, and real leftovers of the attempt."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)

from orchestrator.contract import attempt_pid, write_json_atomic
from orchestrator.executors.local import LocalExecutor
from orchestrator.host.procs import boot_id, group_members, start_time

SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]
# A group leader with a child in its group: what a job with a dataloader worker looks like.
LEADER_WITH_CHILD = [
    sys.executable,
    "-c",
    "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(300)",
]


def start_group(env: dict[str, str], child_env: dict[str, str] | None = None) -> subprocess.Popen:
    """A new session (its own process group) whose leader has one child in the group; the child's
    environment is child_env when given (a job's worker that cleared its environment)."""
    child = SLEEP if child_env is None else ["env", "-i", *(f"{k}={v}" for k, v in child_env.items()), *SLEEP]
    proc = subprocess.Popen([*LEADER_WITH_CHILD, *child], env=env, start_new_session=True)
    wait_for(lambda: len(group_members(proc.pid)) == 2, 30, what="the group's two processes")
    return proc


@pytest.fixture
def lost_attempt(orch_home):
    """A job whose attempt 1 is lost (its supervisor gone), in a real home; yields what it needs
    and kills every process the test started."""
    h = orch_home()
    job_id = h.submit("lost")
    job = dataclasses.replace(h.job(job_id), attempt=1)
    run_dir = h.run_dir(job_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen] = []
    yield h, job, run_dir, started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)


def attempt_env(run_dir: Path) -> dict[str, str]:
    return {**os.environ, "ORCH_RUN_DIR": str(run_dir), "ORCH_ATTEMPT": "1", "ORCH_JOB_ID": "1"}


@pytest.mark.parametrize(
    "how",
    [
        "pid reused this boot: the recorded leader's start time differs",
        "after a reboot: the same pid and start time, recorded under another boot",
    ],
)
def test_a_stranger_holding_the_recorded_group_survives_while_the_attempts_leftover_dies(lost_attempt, how):
    h, job, run_dir, started = lost_attempt
    stranger = start_group(dict(os.environ))
    leftover = subprocess.Popen(SLEEP, env=attempt_env(run_dir), start_new_session=True)
    started += [stranger, leftover]
    stranger_members = group_members(stranger.pid)
    if how.startswith("pid reused"):
        recorded = {"job_pid": stranger.pid, "job_start": "1", "boot_id": boot_id()}
    else:
        recorded = {"job_pid": stranger.pid, "job_start": start_time(stranger.pid), "boot_id": "an-earlier-boot"}
    write_json_atomic(run_dir / attempt_pid(1), {"supervisor_pid": 999999, "supervisor_start": "1", **recorded})

    LocalExecutor(h.home).clear_lost(job)

    assert leftover.wait(30) == -9  # the attempt's own process, found by its environment
    assert stranger.poll() is None and sorted(group_members(stranger.pid)) == sorted(stranger_members)


def test_the_attempts_own_group_dies_whole_even_a_worker_that_cleared_its_environment(lost_attempt):
    h, job, run_dir, started = lost_attempt
    group = start_group(attempt_env(run_dir), child_env={"PATH": os.environ.get("PATH", "")})
    started.append(group)
    members = group_members(group.pid)
    worker = next(pid for pid in members if pid != group.pid)
    write_json_atomic(
        run_dir / attempt_pid(1),
        {
            "supervisor_pid": 999999,
            "supervisor_start": "1",
            "job_pid": group.pid,
            "job_start": start_time(group.pid),
            "boot_id": boot_id(),
        },
    )

    LocalExecutor(h.home).clear_lost(job)

    assert group.wait(30) == -9
    wait_for(lambda: not group_members(group.pid), 30, what="the worker to die with its group")
    assert start_time(worker) is None  # gone (or a zombie nobody reaped: no longer running)
