"""The lifecycle table and the SQLite store under it: every legal transition goes through
Store.transition with its event in the same transaction; illegal ones change nothing; many
processes submitting at once get distinct ids; the file is private, WAL, and migrates forward."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sqlite3
import stat
import time
from collections import deque
from pathlib import Path

import pytest

from orchestrator.spec.config import Config
from orchestrator.model.errors import InvalidTransition, JobNotFound, OrchError
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.home.paths import Home
from orchestrator.model.records import Outgoing
from orchestrator.model.states import TERMINAL, TRANSITIONS, EventKind, JobState, allowed
from orchestrator.store import SCHEMA_VERSION, Store
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome

SPEC = {"name": "t", "gpus": 0, "command": ["python", "train.py"]}
LEGAL = [(src, dst) for src, dsts in TRANSITIONS.items() for dst in sorted(dsts, key=lambda s: s.value)]
ILLEGAL = [(src, dst) for src, dst in itertools.product(JobState, JobState) if not allowed(src, dst)]
# The event each kind of move writes in practice (any kind is accepted by the store).
KIND_FOR = {
    JobState.RUNNING: EventKind.STARTED,
    JobState.QUEUED: EventKind.RETRYING,
    JobState.SUCCEEDED: EventKind.SUCCEEDED,
    JobState.FAILED: EventKind.FAILED,
    JobState.CANCELLED: EventKind.CANCELLED,
    JobState.STOPPED: EventKind.STOPPED,
    JobState.PRUNED: EventKind.PRUNED,
    JobState.MOVED: EventKind.LEASE_LOST,
}


def path_to(target: JobState) -> list[JobState]:
    """Shortest walk through TRANSITIONS from queued to `target` (breadth-first)."""
    seen, todo = {JobState.QUEUED: [JobState.QUEUED]}, deque([JobState.QUEUED])
    while todo:
        state = todo.popleft()
        for nxt in sorted(TRANSITIONS[state], key=lambda s: s.value):
            if nxt not in seen:
                seen[nxt] = seen[state] + [nxt]
                todo.append(nxt)
    return seen[target]


def new_job(store: Store, now: float = 1000.0, **kw):
    return store.submit(
        name=kw.pop("name", "t"),
        kind="command",
        gpus=0,
        priority=0,
        retries=2,
        spec=SPEC,
        spec_path="/x/job.toml",
        now=now,
        **kw,
    )


def job_in(store: Store, state: JobState):
    job = new_job(store)
    t = 1001.0
    for nxt in path_to(state)[1:]:
        job = store.transition(job.id, nxt, KIND_FOR[nxt], t)
        t += 1
    assert job.state is state
    return job


def raw_row(store: Store, job_id: int) -> dict:
    return dict(store.db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone())


def test_every_state_is_reachable_from_queued():
    for state in JobState:
        assert path_to(state)[-1] is state


def test_the_table_is_the_designed_lifecycle():
    Q, R, S, F, C, T, P, M = (
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.STOPPED,
        JobState.PRUNED,
        JobState.MOVED,
    )
    assert TRANSITIONS == {
        Q: {R, C, F, T, M},  # start; cancel; a dependency failed; T: on_env_change = "stop"; M: adopted elsewhere
        R: {S, F, C, T, P, Q, M},  # Q: preempted / checkpointed / OOM / charged retry, resumes; P: a sweep's pruner
        S: set(),
        F: {Q},
        C: {Q},
        T: {Q},
        P: {Q},  # orch retry
        M: set(),  # another machine runs it: never again here
    }


def test_terminal_states_and_the_table_agree():
    assert JobState.SUCCEEDED in TERMINAL and not TRANSITIONS[JobState.SUCCEEDED]
    assert JobState.MOVED in TERMINAL and not TRANSITIONS[JobState.MOVED]
    for state in TERMINAL - {JobState.SUCCEEDED, JobState.MOVED}:
        assert TRANSITIONS[state] == {JobState.QUEUED}, "failed/cancelled/stopped/pruned come back only through retry"
    assert not JobState.QUEUED.is_terminal and JobState.QUEUED.is_active and JobState.RUNNING.is_active


@pytest.mark.parametrize("src, dst", LEGAL, ids=[f"{s.value}->{d.value}" for s, d in LEGAL])
def test_legal_transition_moves_the_job_and_writes_one_event(store, src, dst):
    job = job_in(store, src)
    before = store.events(job.id)

    moved = store.transition(job.id, dst, KIND_FOR[dst], 5000.0, detail=f"{src.value} to {dst.value}")

    assert moved.state is dst and store.get(job.id).state is dst
    assert moved.updated_at == 5000.0
    after = store.events(job.id)
    assert len(after) == len(before) + 1
    last = after[-1]
    assert (last.kind, last.at, last.detail) == (str(KIND_FOR[dst]), 5000.0, f"{src.value} to {dst.value}")


@pytest.mark.parametrize("src, dst", ILLEGAL, ids=[f"{s.value}->{d.value}" for s, d in ILLEGAL])
def test_illegal_transition_raises_and_changes_nothing(store, src, dst):
    job = job_in(store, src)
    row, events, outbox = raw_row(store, job.id), store.events(job.id), store.outbox()

    with pytest.raises(InvalidTransition) as info:
        store.transition(
            job.id,
            dst,
            KIND_FOR[dst],
            9000.0,
            updates={"reason": "should not stick"},
            outgoing=[Outgoing("me", {"event": "x"})],
        )

    assert f"job {job.id} is {src.value}; it cannot become {dst.value}" in str(info.value)
    assert raw_row(store, job.id) == row
    assert store.events(job.id) == events
    assert store.outbox() == outbox


def test_expect_guards_against_a_state_the_caller_did_not_see(store):
    # The daemon thinks the job is queued; the user cancelled it meanwhile.
    job = new_job(store)
    store.transition(job.id, JobState.CANCELLED, EventKind.CANCELLED, 1001.0)
    row, events = raw_row(store, job.id), store.events(job.id)

    with pytest.raises(InvalidTransition):
        # cancelled -> queued is legal in the table, but not from where the caller expected
        store.transition(job.id, JobState.QUEUED, EventKind.RETRYING, 1002.0, expect=[JobState.RUNNING])

    assert raw_row(store, job.id) == row and store.events(job.id) == events


def test_the_event_commits_with_the_state_or_not_at_all(store):
    """If writing the event fails, the state change rolls back with it (one transaction)."""
    job = new_job(store)
    row = raw_row(store, job.id)
    store.db.execute("CREATE TRIGGER no_events BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'disk full'); END")

    with pytest.raises(sqlite3.DatabaseError, match="disk full"):
        store.transition(
            job.id,
            JobState.RUNNING,
            EventKind.STARTED,
            2000.0,
            updates={"attempt": 1},
            begin_attempt=AttemptStart(1, [0]),
        )

    assert raw_row(store, job.id) == row
    assert store.attempts(job.id) == []
    store.db.execute("DROP TRIGGER no_events")
    assert store.transition(job.id, JobState.RUNNING, EventKind.STARTED, 2001.0).state is JobState.RUNNING


def test_transition_writes_attempt_rows_and_outbox_rows_in_the_same_step(store):
    job = new_job(store)
    store.transition(
        job.id,
        JobState.RUNNING,
        EventKind.STARTED,
        10.0,
        updates={"attempt": 1, "gpu_ids": [1]},
        begin_attempt=AttemptStart(1, [1]),
    )
    done = store.transition(
        job.id,
        JobState.SUCCEEDED,
        EventKind.SUCCEEDED,
        70.0,
        end_attempt=AttemptEnd(70.0, AttemptOutcome.SUCCEEDED, exit_code=0, step_reached=99),
        outgoing=[Outgoing("wecom", {"event": "succeeded"}), Outgoing("me", {"event": "succeeded"})],
    )

    (attempt,) = store.attempts(job.id)
    assert (
        attempt.n,
        attempt.started_at,
        attempt.ended_at,
        attempt.exit_code,
        attempt.outcome,
        attempt.step_reached,
        attempt.gpu_ids,
    ) == (1, 10.0, 70.0, 0, "succeeded", 99, [1])
    # Leaving `running` frees the GPUs (the attempt row keeps which ones it had).
    assert done.gpu_ids == [] and done.attempt == 1 and done.finished_at == 70.0
    succeeded = store.events(job.id, kinds=["succeeded"])[-1]
    rows = store.outbox()
    assert [(r.channel, r.event_id, r.job_id) for r in rows] == [
        ("wecom", succeeded.id, job.id),
        ("me", succeeded.id, job.id),
    ]


def test_unknown_job_is_job_not_found(store):
    with pytest.raises(JobNotFound, match="no job 42"):
        store.transition(42, JobState.RUNNING, EventKind.STARTED, 1.0)
    with pytest.raises(JobNotFound):
        store.get(42)
    with pytest.raises(JobNotFound):
        new_job(store, after_ids=[42])
    assert store.jobs() == []


def test_update_is_a_compare_and_set_on_state(store):
    job = job_in(store, JobState.RUNNING)
    assert store.update(job.id, 5.0, only_if_state=[JobState.RUNNING], supervisor_pid=1234) is True
    store.transition(job.id, JobState.SUCCEEDED, EventKind.SUCCEEDED, 6.0)
    assert store.update(job.id, 7.0, only_if_state=[JobState.RUNNING], supervisor_pid=999) is False
    # The finish forgot the attempt's process; the late write did not bring one back.
    assert store.get(job.id).supervisor_pid is None
    with pytest.raises(ValueError, match="not updatable"):
        store.update(job.id, 8.0, state="queued")


def test_set_intent_once_keeps_the_first_reason(store):
    job = job_in(store, JobState.RUNNING)
    assert store.set_intent_once(job.id, "preempt", 1.0, kind=EventKind.PREEMPTED, detail="spot notice")
    assert not store.set_intent_once(job.id, "cancel", 2.0, kind=EventKind.CANCEL_REQUESTED)
    assert store.get(job.id).intent.value == "preempt"
    assert [e.kind for e in store.events(job.id)][-1] == "preempted"


def test_queue_order_is_priority_then_submit_order(store):
    low = new_job(store, name="low")
    high = store.submit(name="high", kind="command", gpus=0, priority=5, retries=0, spec=SPEC, spec_path="", now=1.0)
    low2 = new_job(store, name="low2")
    assert [j.id for j in store.queue_order()] == [high.id, low.id, low2.id]


# -- concurrency ------------------------------------------------------------------------------


def _submit_worker(home_root: str, job_toml: str, n: int, ready, go, results) -> None:
    """One separate process (forked, so it starts in milliseconds): its own Store connection,
    `n` submits through lifecycle.submit_job once every worker is ready."""
    # No git on PATH: provenance is then one failed exec instead of a git process per submit;
    # what is under test here is eight writers on one database.
    os.environ["PATH"] = os.path.join(home_root, "no-bin")
    home = Home(Path(home_root))
    store = Store(home.db)
    ready.release()
    if not go.wait(timeout=60):
        results.put((os.getpid(), "never told to go"))
        return
    ids = [submit_job(store, Config(), home, Path(job_toml), now=time.time(), machine_gpus=0).id for _ in range(n)]
    store.close()
    results.put((os.getpid(), ids))


def test_eight_processes_submitting_fifty_jobs_each_get_400_distinct_ids(home, tmp_path):
    # No Store is open in this process while forking: an SQLite connection must not cross a fork.
    job_toml = tmp_path / "job.toml"
    job_toml.write_text('gpus = 0\ncommand = ["python", "train.py"]\n')
    mp = multiprocessing.get_context("fork")
    ready, go, results = mp.Semaphore(0), mp.Event(), mp.Queue()
    procs = [
        mp.Process(target=_submit_worker, args=(str(home), str(job_toml), 50, ready, go, results)) for _ in range(8)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:  # every worker has its store open before any starts submitting
            assert ready.acquire(timeout=60)
        go.set()
        outcomes = dict(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert sorted(outcomes) == sorted(p.pid for p in procs), "eight distinct processes reported"
    assert all(p.exitcode == 0 for p in procs)
    assert all(isinstance(ids, list) and len(ids) == 50 for ids in outcomes.values()), outcomes

    reported = [i for ids in outcomes.values() for i in ids]
    assert len(reported) == 400 and len(set(reported)) == 400
    store = Store(home / "orch.db")
    jobs = store.jobs()
    assert len(jobs) == 400
    assert {j.id for j in jobs} == set(reported)
    assert all(j.state is JobState.QUEUED for j in jobs)
    submitted = store.events(kinds=["submitted"])
    assert len(submitted) == 400 and {e.job_id for e in submitted} == set(reported)
    assert all((home / "runs" / str(i) / "job.toml").is_file() for i in reported)
    store.close()


# -- the database file --------------------------------------------------------------------------


def test_store_is_wal_private_and_at_the_current_schema(tmp_path):
    folder = tmp_path / "fresh" / "state"
    store = Store(folder / "orch.db")
    new_job(store)

    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "orch.db").stat().st_mode) == 0o600
    with sqlite3.connect(folder / "orch.db") as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()


def test_orch_creates_a_private_home(orch, home, good_job):
    assert not home.exists()
    orch("submit", good_job).assert_ok()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "orch.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "runs").stat().st_mode) == 0o700


def test_a_version_0_database_migrates_forward(tmp_path):
    db = tmp_path / "orch.db"
    sqlite3.connect(db).close()  # an empty database: user_version 0, no tables
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0

    store = Store(db)

    assert store.schema_version() == SCHEMA_VERSION
    job = new_job(store)
    assert store.get(job.id).name == "t"
    store.close()
    again = Store(db)  # opening a current database changes nothing
    assert again.schema_version() == SCHEMA_VERSION and len(again.jobs()) == 1
    again.close()


def test_a_database_from_a_newer_orch_is_refused(tmp_path):
    db = tmp_path / "orch.db"
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 5}")

    newer = rf"written by a newer orch \(schema {SCHEMA_VERSION + 5}, this orch knows {SCHEMA_VERSION}\); upgrade orch"
    with pytest.raises(OrchError, match=newer):
        Store(db)

    with sqlite3.connect(db) as conn:  # and left as it was
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 5
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0


def test_the_cli_refuses_a_newer_database_without_a_traceback(orch, home):
    home.mkdir(mode=0o700)
    with sqlite3.connect(home / "orch.db") as conn:
        conn.execute("PRAGMA user_version=99")

    ran = orch("status", "--json").assert_failed(1)

    assert "written by a newer orch" in ran.err and "upgrade orch" in ran.err
    assert ran.out == ""


def test_reads_see_a_concurrent_writers_commits(store, home):
    reader = Store(home / "orch.db")
    job = new_job(store)
    assert reader.get(job.id).state is JobState.QUEUED
    store.transition(job.id, JobState.RUNNING, EventKind.STARTED, 2.0)
    assert reader.get(job.id).state is JobState.RUNNING
    reader.close()
