"""The bill from the job's own clock: each attempt billed from its start to its supervisor's end,
the time a `kill -9`ed daemon missed billed on restart from the attempt records (idle too), a
failed ledger write that loses nothing, and a real daemon killed mid-attempt whose bill still
matches the attempt's own timestamps."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from cost_helpers import orch_factory, wait_for
from orchestrator.spec.config import Config
from orchestrator.contract import attempt_pid, write_exit_record, write_json_atomic
from orchestrator.cost.money import Pricing, Span, split_spans
from orchestrator.daemon.tick import Daemon
from orchestrator.home.paths import Home
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState
from orchestrator.store import Store

HOUR = 3600.0


def _setup(tmp_path: Path, gpu_ids: list[int], **pricing) -> tuple[Home, Store, Daemon, Config]:
    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    config = Config.model_validate({"pricing": pricing})
    return home, store, Daemon(home, config, store, environ={}, gpu_ids=gpu_ids), config


def _start(store: Store, name: str, gpus: int, at: float, first_gpu: int = 0) -> int:
    job = store.submit(
        name=name,
        kind="command",
        gpus=gpus,
        priority=0,
        retries=0,
        spec={"name": name, "gpus": gpus, "command": ["true"]},
        spec_path="",
        now=at,
    ).id
    store.transition(
        job,
        JobState.RUNNING,
        EventKind.STARTED,
        at,
        updates={"attempt": 1, "gpu_ids": list(range(first_gpu, first_gpu + gpus))},
        begin_attempt=AttemptStart(1, list(range(first_gpu, first_gpu + gpus))),
    )
    return job


def _machine_total(store: Store) -> float:
    return sum(j.cost for j in store.jobs()) + store.ledger()["idle_cost"]


def test_split_spans_bills_each_attempt_only_while_it_ran_and_the_machine_total_holds():
    pricing = Pricing(gpu_hour=2.0, instance_hour=0.5)
    spans = [Span("a", 1, 0.0, 1800.0), Span("b", 1, 900.0)]  # a: first half hour; b from 15 min on
    bill = split_spans(0.0, HOUR, spans, 2, pricing)
    assert bill.run_seconds == {"a": 1800.0, "b": 2700.0}
    assert bill.costs["a"] == pytest.approx(2.25 / 2) and bill.costs["b"] == pytest.approx(2.25 * 0.75)
    assert sum(bill.costs.values()) + bill.idle == pytest.approx(4.5)
    assert bill.gpu_seconds == {"a": 1800.0, "b": 2700.0}
    assert split_spans(10.0, 10.0, spans, 2, pricing).costs == {}


def test_an_attempt_that_ends_between_two_ticks_is_billed_to_its_own_end(tmp_path):
    home, store, d, _ = _setup(tmp_path, [0], gpu_hour=3.6)
    d.accrue(0.0)
    job = _start(store, "a", 1, 5.0)  # started 5 s into the tick's interval, ended at 37 s
    d.accrue(10.0)
    store.transition(
        job, JobState.SUCCEEDED, EventKind.SUCCEEDED, 40.0, end_attempt=AttemptEnd(37.0, AttemptOutcome.SUCCEEDED)
    )
    d.accrue(40.0)  # the tick that reaped it came 3 s after its end
    d.accrue(50.0)
    j = store.get(job)
    assert j.run_seconds == pytest.approx(32.0) and j.cost == pytest.approx(32.0 * 3.6 / HOUR)
    assert _machine_total(store) == pytest.approx(50.0 * 3.6 / HOUR)
    assert store.ledger()["accrued_until"] == pytest.approx(50.0)


def test_a_failed_ledger_write_leaves_its_interval_to_the_next_tick(tmp_path):
    home, store, d, _ = _setup(tmp_path, [], instance_hour=3.6)
    d.accrue(0.0)
    d.accrue(10.0)
    broken = sqlite3.connect(home.db)  # a real write failure: SQLite refuses the ledger update
    broken.execute("CREATE TRIGGER refuse BEFORE UPDATE ON ledger BEGIN SELECT RAISE(ABORT, 'disk I/O'); END")
    broken.commit()
    with pytest.raises(sqlite3.DatabaseError):
        d.accrue(20.0)
    assert store.ledger()["uptime_s"] == pytest.approx(10.0)
    broken.execute("DROP TRIGGER refuse")
    broken.commit()
    broken.close()
    d.accrue(30.0)
    assert store.ledger()["uptime_s"] == pytest.approx(30.0)


def test_a_restarted_daemon_bills_the_missed_time_from_the_attempt_records(tmp_path):
    home, store, d, config = _setup(tmp_path, [0, 1], gpu_hour=2.0, instance_hour=0.5)  # 4.5/h
    t0 = time.time() - 1000.0
    ended, alive = _start(store, "ended", 1, t0), _start(store, "gone", 1, t0, first_gpu=1)
    d.accrue(t0)
    d.accrue(t0 + 50.0)  # then the daemon is killed
    # While no daemon ran: "ended" ran to t0+400 (its supervisor's exit record); "gone" vanished
    # with the machine (no exit record, no process), its log last written at t0+200.
    write_json_atomic(home.run_dir(ended) / attempt_pid(1), {"started_at": t0 + 0.2, "supervisor_pid": None})
    write_exit_record(home.run_dir(ended), 1, 0, None, t0 + 0.2, t0 + 400.0)
    log = home.run_dir(alive) / "attempt-1.log"
    write_json_atomic(home.run_dir(alive) / attempt_pid(1), {"started_at": t0 + 0.1, "supervisor_pid": None})
    log.write_text("step 10\n")
    import os

    os.utime(log, (t0 + 200.0, t0 + 200.0))
    d2 = Daemon(home, config, Store(home.db), environ={}, gpu_ids=[0, 1])
    d2.recover(t0 + 900.0)  # restarted long after both ended
    a, g = store.get(ended), store.get(alive)
    assert a.state is JobState.SUCCEEDED and a.run_seconds == pytest.approx(400.0, abs=1e-6)
    assert g.run_seconds == pytest.approx(200.0, abs=1e-6)
    assert a.cost == pytest.approx(400.0 * 2.25 / HOUR)
    # The machine is billed up to the last sign of any attempt (t0+400): the idle GPU from
    # t0+200 on is idle cost; nothing after, when nothing shows the machine was up.
    ledger = store.ledger()
    assert ledger["uptime_s"] == pytest.approx(400.0)
    assert _machine_total(store) == pytest.approx(400.0 * 4.5 / HOUR)
    d2.accrue(t0 + 910.0)  # the new daemon's own uptime goes on from its start
    assert store.ledger()["uptime_s"] == pytest.approx(410.0)


@pytest.fixture
def make_orch(tmp_path):
    yield from orch_factory(tmp_path)


@pytest.mark.slow
def test_a_kill9_daemon_bills_the_rest_of_the_attempt_from_its_own_timestamps(make_orch):
    o = make_orch({"pricing": {"currency": "CNY", "instance_hour": 3.6}})
    daemon = o.start_daemon()
    job = o.submit(o.command_job("clocked", sleep=4))
    wait_for(lambda: o.job(job).run_seconds > 0.5, 20, "the job to be billed for a while")
    killed_at = time.time()
    o.kill9(daemon)  # SIGKILL: nothing of the daemon's is left to count the rest of the attempt
    billed_by_the_dead_daemon = o.job(job).run_seconds
    record = wait_for(lambda: o.exit_record(job, 1), 20, "the supervisor's exit record")
    assert o.job(job).state is JobState.RUNNING
    o.stop_daemon(o.start_daemon())  # restarted after the job ended, then stopped
    j = o.job(job)
    assert j.state is JobState.SUCCEEDED
    own = record["ended_at"] - record["started_at"]
    assert own > 3.5
    # Everything the job ran after the SIGKILL (by its supervisor's own clock) is billed by the
    # restarted daemon, and nothing twice: at most from the attempt row's start to the job's end.
    (attempt,) = o.store.attempts(job)
    ran_after_the_kill = record["ended_at"] - max(killed_at, record["started_at"])
    assert j.run_seconds - billed_by_the_dead_daemon >= ran_after_the_kill - 1e-6, (j.run_seconds, record, killed_at)
    assert j.run_seconds <= record["ended_at"] - attempt.started_at, (j.run_seconds, record, attempt.started_at)
    assert j.cost == pytest.approx(j.run_seconds * 3.6 / HOUR, rel=1e-6)
    data = o.cli_json("cost")
    assert data["total"] == pytest.approx(data["uptime_s"] * 3.6 / HOUR, rel=1e-3, abs=1e-4)
    assert data["total"] == pytest.approx(sum(r["cost"] for r in data["jobs"]) + data["idle_cost"], abs=1e-5)
