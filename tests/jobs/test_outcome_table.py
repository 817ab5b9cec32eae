"""The outcome table, every row: each intent x each way an attempt ends x what the runner reported
(docs: "What ends an attempt, and what the job becomes"). One pure function decides for the
daemon's reap, `orch run` and a vanished attempt alike, so these rows are the whole behaviour.
The expectations are written out, not computed: a changed row must change this file."""

from __future__ import annotations

import pytest

from orchestrator.jobs.outcome import Exit, Retries, decide
from orchestrator.model.states import AttemptOutcome as O
from orchestrator.model.states import EventKind as E
from orchestrator.model.states import Intent as I
from orchestrator.model.states import JobState as S
from orchestrator.reports.run_report import RunReport

# How an attempt can end: (exit record or None for "vanished", result.json written?)
ENDS = {
    "ok+result": (Exit(0), True),
    "ok": (Exit(0), False),
    "checkpointed": (Exit(75), False),
    "oom": (Exit(76), False),
    "config-error": (Exit(78), False),
    "crash": (Exit(1), False),
    "killed": (Exit(None, 9), False),
    "vanished": (None, False),
}

# (intent, end) -> (state, event, attempt outcome, charged) for a built-in job with retries left.
SUCCESS = (S.SUCCEEDED, E.SUCCEEDED, O.SUCCEEDED, False)
RETRY = (S.QUEUED, E.RETRYING, O.FAILED, True)
TABLE = {
    I.NONE: {
        "ok+result": SUCCESS,
        "ok": (S.FAILED, E.FAILED, O.FAILED, False),  # the runner exited 0 without result.json
        "checkpointed": (S.QUEUED, E.RETRYING, O.CHECKPOINTED, False),
        "oom": (S.QUEUED, E.OOM, O.OOM, False),
        "config-error": (S.FAILED, E.FAILED, O.FAILED, False),  # deterministic: never retried, not charged
        "crash": RETRY,
        "killed": RETRY,
        "vanished": (S.QUEUED, E.PREEMPTED, O.LOST, False),
    },
    I.CANCEL: {
        **{end: (S.CANCELLED, E.CANCELLED, O.CANCELLED, False) for end in ENDS},
        "ok+result": SUCCESS,
        "vanished": (S.CANCELLED, E.CANCELLED, O.LOST, False),
    },
    I.BUDGET: {
        **{end: (S.STOPPED, E.STOPPED, O.STOPPED, False) for end in ENDS},
        "ok+result": SUCCESS,
        "vanished": (S.STOPPED, E.STOPPED, O.LOST, False),
    },
    I.LEASE_LOST: {  # another machine adopted it: `moved`, never `stopped` (the budget's state)
        **{end: (S.MOVED, E.LEASE_LOST, O.MOVED, False) for end in ENDS},
        "ok+result": SUCCESS,
        "vanished": (S.MOVED, E.LEASE_LOST, O.LOST, False),
    },
    I.MOVE: {  # a planned market move: handed over, it runs on the new market's machine
        **{end: (S.MOVED, E.MARKET_MOVE, O.MOVED, False) for end in ENDS},
        "ok+result": SUCCESS,
        "vanished": (S.MOVED, E.MARKET_MOVE, O.LOST, False),
    },
    I.PRUNE: {
        **{end: (S.PRUNED, E.PRUNED, O.PRUNED, False) for end in ENDS},
        "ok+result": SUCCESS,
        "vanished": (S.PRUNED, E.PRUNED, O.LOST, False),
    },
    I.HANG: {  # the watchdog's retry is charged whatever the exit code
        **{end: RETRY for end in ENDS},
        "ok+result": SUCCESS,
        "vanished": (S.QUEUED, E.RETRYING, O.LOST, True),
    },
    I.PREEMPT: {
        **{end: (S.QUEUED, E.PREEMPTED, O.PREEMPTED, False) for end in ENDS},
        "ok+result": SUCCESS,
        "vanished": (S.QUEUED, E.PREEMPTED, O.LOST, False),
    },
}
CASES = [(intent, end) for intent in TABLE for end in ENDS]


def test_the_table_names_every_intent():
    assert set(TABLE) == set(I)


@pytest.mark.parametrize("intent,end", CASES, ids=[f"{i.value or 'none'}-{e}" for i, e in CASES])
def test_every_intent_and_every_ending(intent, end):
    ended, has_result = ENDS[end]
    d = decide(intent, ended, RunReport(has_result=has_result), is_command=False, retries=Retries(0, 2))
    assert (d.state, d.event, d.outcome, d.charged) == TABLE[intent][end]
    assert d.state.is_terminal or d.state is S.QUEUED


def test_a_lease_lost_job_is_never_stopped_nor_retryable():
    """Defect: a lost lease used to read as a budget stop (`stopped`, "retry --budget"), and
    `orch retry` then ran the job on two machines."""
    from orchestrator.model.states import RETRYABLE, TRANSITIONS

    for ended in (Exit(75), Exit(0), Exit(None, 15), None):
        d = decide(I.LEASE_LOST, ended, RunReport(), is_command=True, retries=Retries(0, 3))
        assert d.state is S.MOVED and d.event is E.LEASE_LOST
    assert S.MOVED not in RETRYABLE and TRANSITIONS[S.MOVED] == frozenset()


@pytest.mark.parametrize(
    "retries,state,charged_reason",
    [
        (Retries(0, 2), S.QUEUED, "retry 1 of 2"),
        (Retries(1, 2), S.QUEUED, "retry 2 of 2"),
        (Retries(2, 2), S.FAILED, "after 2 retries"),
        (Retries(0, 0), S.FAILED, "exit code 1"),
    ],
)
def test_a_crash_is_retried_while_retries_remain(retries, state, charged_reason):
    d = decide(I.NONE, Exit(1), RunReport(), is_command=False, retries=retries)
    assert d.state is state and d.charged and charged_reason in d.reason
    assert d.backoff is (state is S.QUEUED)


def test_a_command_job_exiting_0_succeeds_without_result_json():
    d = decide(I.NONE, Exit(0), RunReport(), is_command=True, retries=Retries())
    assert d.state is S.SUCCEEDED


DIVERGED = {"step": 37, "what": "the training loss became nan", "attempt": "1", "checkpoint": "step-30.ckpt"}
DISK_FULL = {"attempt": "1", "name": "step-40.ckpt", "needed_bytes": 2e9, "free_bytes": 1e6, "folder": "/x"}
OOM = {"attempt": "1", "step": 5, "from": {"batch_size": 8, "accumulate_grad_batches": 1}}
OOM["to"] = {"batch_size": 4, "accumulate_grad_batches": 2}


@pytest.mark.parametrize("end", ["ok", "checkpointed", "oom", "crash", "killed"])
@pytest.mark.parametrize(
    "report,state,event,charged,said",
    [
        (RunReport(diverged=DIVERGED), S.FAILED, E.FAILED, True, "at step 37"),
        (RunReport(disk_full=DISK_FULL), S.FAILED, E.FAILED, True, "disk full"),
        (RunReport(diverged=DIVERGED, disk_full=DISK_FULL), S.FAILED, E.FAILED, True, "diverged"),
        (
            RunReport(job_error={"attempt": "1", "message": "data.train: x.jsonl is empty"}),
            S.FAILED,
            E.FAILED,
            False,
            "x.jsonl is empty",
        ),
    ],
)
def test_what_the_runner_reported_decides_before_the_exit_code(end, report, state, event, charged, said):
    ended, _ = ENDS[end]
    d = decide(I.NONE, ended, report, is_command=False, retries=Retries(0, 5), job_id=4)
    assert (d.state, d.event, d.charged) == (state, event, charged) and said in d.reason


@pytest.mark.parametrize("intent", [i for i in I if i is not I.NONE])
def test_the_runner_report_never_overrides_the_daemons_intent(intent):
    report = RunReport(diverged=DIVERGED, disk_full=DISK_FULL, job_error={"attempt": "1", "message": "m"})
    d = decide(intent, Exit(1), report, is_command=False, retries=Retries(0, 2))
    assert (d.state, d.event, d.outcome, d.charged) == TABLE[intent]["crash"]


def test_an_oom_record_is_the_truth_over_a_killed_rank():
    """Under DDP an OOM on another rank makes Lightning kill rank 0: batch.json decides."""
    d = decide(I.NONE, Exit(None, 9), RunReport(oom=OOM), is_command=False, retries=Retries(0, 2))
    assert d.state is S.QUEUED and d.outcome is O.OOM and not d.charged and "batch 8 -> 4" in d.reason


def test_a_vanished_attempt_ignores_what_its_run_folder_says():
    """No exit record: the job resumes; a half-written report from before the loss decides nothing."""
    d = decide(I.NONE, None, RunReport(diverged=DIVERGED, oom=OOM), is_command=False, retries=Retries(0, 2))
    assert (d.state, d.outcome, d.charged) == (S.QUEUED, O.LOST, False)
