"""[idle] shutdown: IdleShutdown.check with an injected clock on a real DaemonRuntime (real store,
real shutdown command, real loopback webhook), then a real daemon whose shutdown command appends
to a file: once per idle period, never while a job is queued, held or running."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cost_helpers import PY, WebhookReceiver, orch_factory, wait_for
from orchestrator.spec.config import Config
from orchestrator.daemon.runtime import DaemonRuntime
from orchestrator.jobs.lifecycle import cancel_job
from orchestrator.home.paths import Home
from orchestrator.model.states import EventKind, JobState
from orchestrator.store import Store
from orchestrator.model.records import AttemptStart

APPEND = "import sys, time; open(sys.argv[1], 'a').write('%f\\n' % time.time())"


@pytest.fixture
def make_orch(tmp_path):
    yield from orch_factory(tmp_path)


def _runtime(
    tmp_path: Path, marker: Path, *, minutes: float = 1.0, notifiers: list | None = None, notify_wait: float = 30.0
) -> DaemonRuntime:
    home = Home(tmp_path / "home").ensure()
    config = Config.model_validate(
        {
            "daemon": {"gpus": []},
            "idle": {
                "shutdown_after_minutes": minutes,
                "shutdown_command": [PY, "-c", APPEND, str(marker)],
                "notify_wait_seconds": notify_wait,
            },
            "notifiers": notifiers or [],
        }
    )
    return DaemonRuntime(home, config, Store(home.db))


def _fired(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def _held_job(rt: DaemonRuntime, now: float, not_before: float | None = None) -> int:
    return rt.store.submit(
        name="h",
        kind="command",
        gpus=0,
        priority=0,
        retries=0,
        spec={"name": "h", "gpus": 0, "command": ["true"]},
        spec_path="",
        now=now,
        not_before=not_before,
    ).id


def test_fires_once_after_the_idle_period_and_again_only_after_new_work(tmp_path):
    marker = tmp_path / "shutdown.log"
    rt = _runtime(tmp_path, marker, minutes=1.0)
    idle = rt.idle
    idle.check(1000.0)  # the countdown starts
    idle.check(1059.0)
    assert _fired(marker) == 0
    idle.check(1060.0)
    assert _fired(marker) == 1
    assert [e.kind for e in rt.store.events(kinds=["idle_shutdown"])] == ["idle_shutdown"]
    idle.check(1200.0)
    idle.check(5000.0)
    assert _fired(marker) == 1  # once: the machine is going down (or the command failed, loudly)

    # A job held with --at counts as queued: no shutdown however long it waits.
    job = _held_job(rt, 5001.0, not_before=10_000_000.0)
    for t in (5001.0, 5100.0, 9000.0):
        idle.check(t)
    assert _fired(marker) == 1
    # It goes away: a new idle period, a second shutdown after a full minute of it.
    cancel_job(rt.store, rt.config, rt.home, job, 9001.0)
    idle.check(9001.0)
    idle.check(9060.0)
    assert _fired(marker) == 1
    idle.check(9061.0)
    assert _fired(marker) == 2


def test_work_during_the_countdown_cancels_it(tmp_path):
    marker = tmp_path / "shutdown.log"
    rt = _runtime(tmp_path, marker, minutes=1.0)
    rt.idle.check(0.0)
    rt.idle.check(50.0)
    job = _held_job(rt, 55.0)  # submitted 5 s before the shutdown was due
    rt.idle.check(55.0)
    rt.store.transition(
        job, JobState.RUNNING, EventKind.STARTED, 56.0, updates={"attempt": 1}, begin_attempt=AttemptStart(1)
    )
    rt.idle.check(61.0)
    rt.idle.check(100.0)
    rt.store.transition(job, JobState.SUCCEEDED, EventKind.SUCCEEDED, 101.0, updates={"finished_at": 101.0})
    rt.idle.check(101.0)
    rt.idle.check(160.0)
    assert _fired(marker) == 0  # the countdown started again at 101
    rt.idle.check(161.0)
    assert _fired(marker) == 1


def test_off_by_default(tmp_path):
    home = Home(tmp_path / "home").ensure()
    rt = DaemonRuntime(home, Config(), Store(home.db))
    for t in (0.0, 10_000.0, 100_000.0):
        rt.idle.check(t)
    assert rt.store.events(kinds=["idle_shutdown"]) == []


def test_the_notification_goes_out_before_the_shutdown_command(tmp_path):
    receiver = WebhookReceiver()
    try:
        marker = tmp_path / "shutdown.log"
        rt = _runtime(tmp_path, marker, minutes=1.0, notifiers=[{"type": "webhook", "url": receiver.url}])
        rt.idle.check(0.0)
        rt.idle.check(60.0)  # records the event, delivers it, sees it delivered, runs the command
        assert [m["event"] for m in receiver.received] == ["idle_shutdown"]
        assert _fired(marker) == 1
        assert "idle for 1 min" in receiver.received[0]["message"]["reason"]
    finally:
        receiver.close()


def test_an_undeliverable_notification_delays_the_shutdown_only_notify_wait_seconds(tmp_path):
    marker = tmp_path / "shutdown.log"
    # Nothing listens on port 9 of loopback: every try fails and is retried later.
    rt = _runtime(
        tmp_path,
        marker,
        minutes=1.0,
        notify_wait=30.0,
        notifiers=[{"type": "webhook", "url": "http://127.0.0.1:9/nobody"}],
    )
    base = time.time() - 60  # the outbox sender reads the real clock: keep the two together
    rt.idle.check(base)
    rt.idle.check(base + 60)  # records the event; the first try is refused
    [row] = rt.store.outbox()
    assert row.tries == 1 and row.delivered_at is None and row.gave_up_at is None
    rt.idle.check(base + 80)
    assert _fired(marker) == 0  # still hoping the message gets out
    rt.idle.check(base + 90)
    assert _fired(marker) == 1  # bounded: the machine must not bill forever for a notification


@pytest.mark.slow
def test_real_daemon_runs_the_shutdown_command_once_per_idle_period(make_orch, tmp_path):
    marker = tmp_path / "shutdown.log"
    o = make_orch(
        {
            "idle": {
                "shutdown_after_minutes": 0.03,  # 1.8 s
                "shutdown_command": [PY, "-c", APPEND, str(marker)],
            }
        }
    )
    daemon = o.start_daemon()
    wait_for(lambda: _fired(marker) == 1, 60, "the first idle shutdown")
    # (once per idle period, and a job held with --at counting as queued: the in-process tests above)

    # A job runs (longer than the idle period): nothing while it runs, once after it.
    job = o.submit(o.command_job("work", sleep=3))
    o.wait_state(job, JobState.RUNNING)
    done = o.wait_state(job, JobState.SUCCEEDED)
    wait_for(lambda: _fired(marker) == 2, 60, "the shutdown after the job")
    second = float(marker.read_text().splitlines()[1])
    assert second >= done.finished_at, (second, done.finished_at)  # not while it ran
    kinds = [e.kind for e in o.store.events(kinds=["idle_shutdown"])]
    assert kinds == ["idle_shutdown"] * 2
    assert o.stop_daemon(daemon) == 0
