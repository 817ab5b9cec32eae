"""Accounting on and off, both real: a private cluster with slurmdbd + MariaDB, and one without
(AccountingStorageType=none: `sacct` answers "accounting storage is disabled"). Both forget a
finished job after MinJobAge (2 s here); the daemon is down (kill -9) while the job finishes and
is forgotten, and on restart it must still settle the job from what it can learn: with
accounting sacct says COMPLETED; without, squeue's silence plus the exit record decide. Neither
path reads the missing answer as a failure."""

from __future__ import annotations

import shutil
import time

import pytest

from conftest import slurm_id
from daemon_harness import wait_for
from orchestrator.model.states import JobState
from slurm_cluster import SlurmCluster, why_no_accounting

pytestmark = pytest.mark.slow


@pytest.fixture(params=["off", "on"])
def small_cluster(request, slurm):
    if request.param == "on" and why_no_accounting():
        pytest.skip(why_no_accounting())
    c = SlurmCluster(min_job_age=2, accounting=request.param == "on")
    try:
        c.start()
    except Exception as exc:  # pragma: no cover
        c.stop()
        pytest.skip(f"the accounting cluster did not start: {exc}")
    c.mode = request.param
    yield c
    c.stop()
    shutil.rmtree(c.base, ignore_errors=True)


def test_job_forgotten_by_squeue_while_the_daemon_was_down_is_settled(slurm_home, small_cluster):
    c = small_cluster
    h = slurm_home(cluster=c)
    d = h.start_daemon()
    job = h.submit("forgotten", hold="go", exit=0)
    sid = slurm_id(h, job)
    h.wait_record("forgotten", "start", timeout=30)
    h.kill9(d)
    h.release("go")
    wait_for(lambda: h.exit_record(job, 1), 30, what="the exit record")
    wait_for(
        lambda: not c.run("squeue", "-h", "-t", "all", "-j", sid, "-o", "%i", check=False).stdout.strip(),
        60,
        interval=0.5,
        what="squeue to forget the job",
    )
    if c.mode == "on":
        wait_for(
            lambda: (
                "COMPLETED"
                in c.run(
                    "sacct", "-X", "-n", "-P", "-j", sid, "-o", "State", "--starttime=now-1days", check=False
                ).stdout
            ),
            30,
            interval=0.5,
            what="sacct to record it",
        )
    # past the executor's "just submitted, squeue may not list it yet" allowance (10 s)
    wait_for(lambda: time.time() - h.job(job).executor_ref["submitted_at"] > 10.5, 15, interval=0.2)
    h.start_daemon()
    done = h.wait_state(job, JobState.SUCCEEDED, timeout=30)
    assert done.failures == 0 and done.attempt == 1
    log = h.home.log_file.read_text()
    if c.mode == "on":
        assert f"Slurm job {sid} is no longer in squeue; sacct says COMPLETED" in log, log[-2000:]
    else:
        assert f"Slurm job {sid} is no longer in squeue and accounting is off" in log, log[-2000:]
