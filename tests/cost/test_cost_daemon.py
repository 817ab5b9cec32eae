"""Cost as the daemon keeps it: accrual tick by tick on the real store (an injected clock), kept
across attempts, a gap with no daemon and no attempt not billed; preemption waste at the next attempt; ETA and
projected cost in status/show; `orch cost` totals; the worked example and the [hooks] through
a real daemon."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cost_helpers import PY, orch_factory, wait_for
from orchestrator.spec.config import Config
from orchestrator.views.cost_report import cost_data, cost_table
from orchestrator.daemon.tick import Daemon
from orchestrator.home.paths import Home
from orchestrator.model.states import EventKind, JobState
from orchestrator.store import Store
from orchestrator.views.jobs import show_data, status_rows
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome

HOUR = 3600.0


@pytest.fixture
def make_orch(tmp_path):
    yield from orch_factory(tmp_path)


def _config(**pricing) -> Config:
    return Config.model_validate({"pricing": pricing})


def _setup(tmp_path: Path, gpu_ids: list[int], **pricing) -> tuple[Home, Store, Daemon]:
    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    return home, store, Daemon(home, _config(**pricing), store, environ={}, gpu_ids=gpu_ids)


def _submit(store: Store, name: str, gpus: int, now: float, spec: dict | None = None, **kw) -> int:
    spec = spec or {"name": name, "gpus": gpus, "command": ["true"]}
    return store.submit(
        name=name,
        kind="command" if "command" in spec else "builtin",
        gpus=gpus,
        priority=0,
        retries=0,
        spec=spec,
        spec_path="",
        now=now,
        **kw,
    ).id


def _run(store: Store, job_id: int, now: float, gpu_ids: list[int], resumed_from: int | None = None) -> None:
    """Put a queued job into `running` the way the daemon's _start does (without a process)."""
    job = store.get(job_id)
    n = job.attempt + 1
    store.transition(
        job_id,
        JobState.RUNNING,
        EventKind.STARTED,
        now,
        updates={"attempt": n, "gpu_ids": gpu_ids},
        begin_attempt=AttemptStart(n, gpu_ids, resumed_from),
    )


def _accrue_span(daemon: Daemon, start: float, end: float, step: float = 30.0) -> None:
    t = start
    while t < end:
        t = min(end, t + step)
        daemon.accrue(t)


# -- accrual with an injected clock ------------------------------------------------------------


def test_spec_example_one_gpu_job_alone_costs_half_of_a_two_gpu_machine(tmp_path):
    home, store, d = _setup(tmp_path, [0, 1], gpu_hour=2.0, instance_hour=0.5)
    job = _submit(store, "a", 1, 0.0)
    _run(store, job, 0.0, [0])
    d.accrue(0.0)  # the first tick only starts the clock
    _accrue_span(d, 0.0, HOUR)
    j, ledger = store.get(job), store.ledger()
    assert j.cost == pytest.approx(2.25)
    assert ledger["idle_cost"] == pytest.approx(2.25)
    assert ledger["uptime_s"] == pytest.approx(HOUR)
    assert j.gpu_seconds == pytest.approx(HOUR) and j.run_seconds == pytest.approx(HOUR)
    data = cost_data(store, _config(gpu_hour=2.0, instance_hour=0.5))
    assert data["total"] == pytest.approx(4.5)
    assert data["jobs"][0]["gpu_hours"] == pytest.approx(1.0)


def test_cpu_jobs_share_the_instance_price_and_the_machine_total_holds(tmp_path):
    home, store, d = _setup(tmp_path, [], instance_hour=0.9)
    a, b = _submit(store, "a", 0, 0.0), _submit(store, "b", 0, 0.0)
    _run(store, a, 0.0, [])
    d.accrue(0.0)
    _accrue_span(d, 0.0, 600.0)  # a alone for 10 min: all of it
    _run(store, b, 600.0, [])
    _accrue_span(d, 600.0, 1200.0)  # a and b for 10 min: half each
    assert store.get(a).cost == pytest.approx(0.9 / 6 + 0.9 / 12)
    assert store.get(b).cost == pytest.approx(0.9 / 12)
    assert store.ledger()["idle_cost"] == pytest.approx(0.0, abs=1e-9)
    data = cost_data(store, _config(instance_hour=0.9))
    assert data["total"] == pytest.approx(1200 / HOUR * 0.9)


def test_cost_survives_requeue_and_a_daemon_restart_but_a_gap_with_nothing_running_is_not_billed(tmp_path):
    home, store, d = _setup(tmp_path, [0], gpu_hour=1.0)
    job = _submit(store, "a", 1, 0.0)
    _run(store, job, 0.0, [0])
    d.accrue(0.0)
    _accrue_span(d, 0.0, 1800.0)
    assert store.get(job).cost == pytest.approx(0.5)
    # Preempted: back to the queue; its cost stays with it, queued time is idle.
    store.transition(
        job,
        JobState.QUEUED,
        EventKind.PREEMPTED,
        1800.0,
        updates={"gpu_ids": []},
        end_attempt=AttemptEnd(1800.0, AttemptOutcome.PREEMPTED),
    )
    _accrue_span(d, 1800.0, 2400.0)
    assert store.get(job).cost == pytest.approx(0.5)
    assert store.ledger()["idle_cost"] == pytest.approx(600 / HOUR)
    # The daemon dies; a new one starts 5 hours later: that gap is not in anyone's bill.
    d2 = Daemon(home, _config(gpu_hour=1.0), Store(home.db), environ={}, gpu_ids=[0])
    _run(store, job, 2400.0 + 5 * HOUR, [0], resumed_from=100)
    d2.accrue(2400.0 + 5 * HOUR)
    _accrue_span(d2, 2400.0 + 5 * HOUR, 2400.0 + 5 * HOUR + 1800.0)
    j = store.get(job)
    assert j.cost == pytest.approx(1.0) and j.run_seconds == pytest.approx(HOUR)
    assert store.ledger()["uptime_s"] == pytest.approx(2400.0 + 1800.0)


def test_a_stalled_tick_is_billed_at_most_a_minute(tmp_path):
    home, store, d = _setup(tmp_path, [], instance_hour=3.6)
    d.accrue(0.0)
    d.accrue(10_000.0)  # a suspended laptop, a frozen VM: not charged as if it ran
    assert store.ledger()["uptime_s"] == pytest.approx(60.0)
    d.accrue(10_000.0)  # same instant again: nothing
    d.accrue(9_000.0)  # clock went back: nothing, and no negative interval
    assert store.ledger()["uptime_s"] == pytest.approx(60.0)


# -- ETA and projected cost --------------------------------------------------------------------


def _running_with_progress(
    tmp_path, spec: dict, *, started: float, resumed_from: int | None, progress: dict, cost: float, run_seconds: float
):
    home, store, d = _setup(tmp_path, [])
    job = _submit(store, "p", 0, started - 10, spec=spec)
    _run(store, job, started, [], resumed_from=resumed_from)
    store.update(job, started, cost=cost, run_seconds=run_seconds)
    run_dir = home.run_dir(job)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "progress.json").write_text(json.dumps(progress))
    return home, store, job


BUILTIN = {"name": "p", "gpus": 0, "model": {"name_or_path": "x"}, "data": {"train": "t.jsonl"}}


def test_eta_and_projection_from_progress_of_a_running_builtin_job(tmp_path):
    # Resumed at step 100, 200 steps done in 100 s: 2 steps/s, 700 left -> 350 s. It has paid
    # 1.0 for 1000 s of running (3.6/h), so 350 s more cost 0.35.
    home, store, job = _running_with_progress(
        tmp_path,
        BUILTIN,
        started=1000.0,
        resumed_from=100,
        progress={"step": 300, "total_steps": 1000, "updated_at": 1100.0},
        cost=1.0,
        run_seconds=1000.0,
    )
    [row] = status_rows(store, home, 1100.0)
    assert row["eta_s"] == pytest.approx(350.0)
    assert row["steps_per_s"] == pytest.approx(2.0)
    assert row["projected_cost"] == pytest.approx(1.35)
    assert row["projection_is_upper_bound"] is False
    shown = show_data(store, home, job, now=1100.0)
    assert shown["projected_cost"] == pytest.approx(1.35) and shown["eta_s"] == pytest.approx(350.0)
    from orchestrator.views.render import projected, show_text

    assert projected(row) == "≈ 1.35"  # the PROJECTED column
    assert "≈ 1.35" in show_text(shown)


def test_with_early_stopping_the_projection_is_an_upper_bound(tmp_path):
    spec = {**BUILTIN, "early_stopping": {"monitor": "val_acc", "mode": "max", "patience": 2}}
    home, store, job = _running_with_progress(
        tmp_path,
        spec,
        started=0.0,
        resumed_from=None,
        progress={"step": 50, "total_steps": 100, "updated_at": 50.0},
        cost=0.5,
        run_seconds=50.0,
    )
    [row] = status_rows(store, home, 50.0)
    assert row["eta_s"] == pytest.approx(50.0)
    assert row["projected_cost"] == pytest.approx(1.0)
    assert row["projection_is_upper_bound"] is True
    from orchestrator.views.render import projected, show_text

    assert projected(row, "CNY") == "≤ 1.00 CNY"
    assert "upper bound" in show_text(show_data(store, home, job, now=50.0))


def test_no_eta_from_a_previous_attempts_progress_or_without_total(tmp_path):
    # progress.json older than this attempt (the last one wrote it): no pace to go by yet.
    home, store, job = _running_with_progress(
        tmp_path,
        BUILTIN,
        started=1000.0,
        resumed_from=300,
        progress={"step": 300, "total_steps": 1000, "updated_at": 990.0},
        cost=1.0,
        run_seconds=100.0,
    )
    [row] = status_rows(store, home, 1000.0)
    assert row["eta_s"] is None and row["projected_cost"] is None
    (home.run_dir(job) / "progress.json").write_text(
        json.dumps({"step": 400, "total_steps": None, "updated_at": 1050.0})
    )
    [row] = status_rows(store, home, 1050.0)
    assert row["step"] == 400 and row["eta_s"] is None and row["projected_cost"] is None


def test_status_reads_progress_only_for_running_jobs(tmp_path):
    home, store, d = _setup(tmp_path, [])
    done = _submit(store, "done", 0, 0.0)
    _run(store, done, 0.0, [])
    store.transition(done, JobState.SUCCEEDED, EventKind.SUCCEEDED, 5.0, updates={"finished_at": 5.0})
    run_dir = home.run_dir(done)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "progress.json").write_text(json.dumps({"step": 7, "total_steps": 9, "updated_at": 4.0}))
    [row] = status_rows(store, home, 10.0, include_all=True)
    assert row["state"] == "succeeded" and row["step"] is None and row["projected_cost"] is None
    assert show_data(store, home, done, now=10.0)["step"] == 7  # `orch show` of one job does read it


# -- waste ---------------------------------------------------------------------------------------


def test_steps_past_the_checkpoint_are_waste_at_the_next_attempt(tmp_path):
    """Attempt 1 (a real process) checkpoints at step 30, reports step 40 and crashes; attempt 2
    resumes from 30: 10 steps lost, at attempt 1's mean step time, priced at the job's rate."""
    home, store, d = _setup(tmp_path, [], instance_hour=36.0)
    script = tmp_path / "j.py"
    from cost_helpers import JOB_SCRIPT

    script.write_text(JOB_SCRIPT)
    behaviour = {"ckpt": 30, "step": 40, "total": 100, "sleep": 0.5, "exit": 1, "exit_per_attempt": {"2": 0}}
    spec = {"name": "w", "gpus": 0, "retries": 1, "command": [PY, str(script), json.dumps(behaviour)]}
    job = store.submit(
        name="w", kind="command", gpus=0, priority=0, retries=1, spec=spec, spec_path="", now=time.time()
    ).id
    d.config.daemon.retry_backoff_seconds = 0.0

    def tick_until(pred, what):
        def step():
            d.tick(time.time())
            return pred()

        return wait_for(step, 30, what, interval=0.1)

    tick_until(lambda: store.get(job).attempt >= 2, "attempt 2 to start")
    j = store.get(job)
    a1, a2 = store.attempts(job)[:2]
    assert a1.step_reached == 40 and a2.resumed_from_step == 30
    step_s = (a1.ended_at - a1.started_at) / 40
    assert j.steps_lost == 10
    assert j.waste_seconds == pytest.approx(10 * step_s)
    assert j.waste_cost == pytest.approx(10 * step_s * j.cost / j.run_seconds)
    tick_until(lambda: store.get(job).state is JobState.SUCCEEDED, "the job to succeed")
    data = cost_data(store, d.config)
    assert data["jobs"][0]["waste"] == pytest.approx(round(j.waste_cost, 6))
    assert data["jobs"][0]["steps_lost"] == 10
    assert "10 steps redone" in cost_table(data)


# -- through a real daemon -----------------------------------------------------------------------


DUMP = "import json, os, sys; open(sys.argv[1], 'a').write(json.dumps({k: v for k, v in os.environ.items() if k.startswith('ORCH_')}) + '\\n')"


@pytest.mark.slow
def test_spec_example_and_hooks_through_a_real_daemon(make_orch, tmp_path):
    hooks = tmp_path / "hooks.jsonl"
    o = make_orch(
        {
            "daemon": {"gpus": [0, 1]},
            "pricing": {"currency": "CNY", "gpu_hour": 2.0, "instance_hour": 0.5},
            "hooks": {f"on_{e}": [PY, "-c", DUMP, str(hooks)] for e in ("succeeded", "failed", "queue_drained")},
        },
        gpus_on_cpu=True,  # its two GPU slots are this CPU machine's
    )
    daemon = o.start_daemon()
    ok = o.submit(o.command_job("gpu-job", gpus=1, sleep=3))
    j = o.wait_state(ok, JobState.SUCCEEDED)
    # Snapshot while nothing else ran: the idle part of the machine while the job ran alone
    # equals the job's cost (2.25/h each), the rest of the uptime is idle at 4.5/h.
    ledger = o.store.ledger()
    j = o.job(ok)
    assert j.run_seconds > 2.5
    assert j.cost == pytest.approx(j.run_seconds * 2.25 / HOUR, rel=1e-6)
    idle_while_running = ledger["idle_cost"] - (ledger["uptime_s"] - j.run_seconds) * 4.5 / HOUR
    assert idle_while_running == pytest.approx(j.cost, rel=0.02)

    bad = o.submit(o.command_job("bad-job", exit=3))
    o.wait_state(bad, JobState.FAILED)
    wait_for(lambda: hooks.exists() and len(hooks.read_text().splitlines()) >= 4, 20, "the four hooks")
    assert o.stop_daemon(daemon) == 0

    data = o.cli_json("cost")
    assert data["currency"] == "CNY"
    assert data["total"] == pytest.approx(sum(r["cost"] for r in data["jobs"]) + data["idle_cost"], abs=1e-5)
    assert data["total"] == pytest.approx(data["uptime_s"] * 4.5 / HOUR, rel=1e-3, abs=1e-4)
    assert data["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in data["jobs"]), abs=1e-5)
    assert {r["id"] for r in data["jobs"]} == {ok, bad}
    assert o.cli("cost").returncode == 0

    seen = [json.loads(line) for line in hooks.read_text().splitlines()]
    events = [(e["ORCH_EVENT"], e["ORCH_JOB_ID"]) for e in seen]
    # Each job's end, then the drained queue after it (hooks run in order on one thread).
    assert events == [("succeeded", str(ok)), ("queue_drained", ""), ("failed", str(bad)), ("queue_drained", "")]
    assert seen[0]["ORCH_JOB_NAME"] == "gpu-job" and seen[0]["ORCH_JOB_STATE"] == "succeeded"
    assert float(seen[0]["ORCH_JOB_COST"]) >= 0 and seen[0]["ORCH_RUN_DIR"].endswith(f"/runs/{ok}")
    assert seen[2]["ORCH_JOB_STATE"] == "failed"
