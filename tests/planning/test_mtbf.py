"""This machine's MTBF, the M of `every = "auto"` (issue 28, defect 6): only notices that stop jobs
count (an AWS rebalance warning stops nothing), and a machine loss counts once however many
attempts it lost. One count (planning/mtbf.py) for the daemon and `orch estimate`, one choice
(contract.mtbf_choice) for them and the runner. Pure, and on a real store."""

from __future__ import annotations

import time

import pytest
from daemon_harness import orch_home  # noqa: F401  (fixture)

from orchestrator.jobs.estimate import mtbf_of
from orchestrator.contract import DEFAULT_MTBF_S, mtbf_choice
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState
from orchestrator.planning.mtbf import machine_events, machine_mtbf
from orchestrator.spec.jobspec import load_jobspec


@pytest.mark.parametrize(
    "notices, lost_at, events",
    [
        ([], [], 0),
        (["aws: rebalance: recommended"], [], 0),
        (["aws: preempt: 2 min", "gcp: maintenance: TERMINATE"], [], 2),
        (["file: preempt: file present", "aws: rebalance: x"], [], 1),
        ([], [100.0, 100.0, 100.0], 1),  # one machine loss, three attempts lost with it
        ([], [100.0, 100.0, 500.0], 2),
        (["aws: rebalance: x", "aws: preempt: y"], [100.0, 100.0], 2),
    ],
)
def test_machine_events_count_stopping_notices_and_each_loss_once(notices, lost_at, events):
    assert machine_events(notices, lost_at) == events


def test_machine_mtbf_and_the_one_choice():
    assert machine_mtbf([], [], 3600.0) is None
    assert machine_mtbf(["aws: rebalance: x"], [], 3600.0) is None
    assert machine_mtbf(["aws: preempt: y"], [1.0, 1.0], 0.0) is None
    assert machine_mtbf(["aws: preempt: y"], [1.0, 1.0], 7200.0) == (3600.0, 2)
    assert mtbf_choice(2.0, 100.0) == (7200.0, "job.toml [checkpoint] mtbf_hours")
    assert mtbf_choice(None, 100.0)[0] == 100.0
    assert mtbf_choice(None, None) == (DEFAULT_MTBF_S, "no preemption seen here yet: orch assumes 6 h")


def test_orch_estimates_mtbf_ignores_rebalances_and_counts_a_lost_machine_once(orch_home):
    h = orch_home()
    now = time.time()
    h.store.accrue(now, 3600.0, {}, 0.0)  # one hour of daemon uptime
    h.store.record_event(None, EventKind.NOTICE, now, detail="aws: rebalance: rebalance recommended")
    h.store.record_event(None, EventKind.NOTICE, now, detail="aws: preempt: the instance stops at 10:02")
    for name in ("a", "b", "c"):  # the machine went away under three running jobs
        job_id = h.submit(name)
        h.store.transition(job_id, JobState.RUNNING, EventKind.STARTED, now, begin_attempt=AttemptStart(1))
        h.store.transition(
            job_id,
            JobState.QUEUED,
            EventKind.RETRYING,
            now + 60,
            end_attempt=AttemptEnd(ended_at=now + 60, outcome=AttemptOutcome.LOST),
        )
    seconds, why = mtbf_of(h.store, load_jobspec(h.job_file("d")))
    assert seconds == pytest.approx(1800.0), why  # 3600 s over 2 machine events, not 5
    assert "2 preemption(s)" in why
