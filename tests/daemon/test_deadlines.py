"""Deadlines: `deadline` in job.toml (a time zone required, a past one refused), earliest deadline
first among equal priority, and one `deadline_at_risk` event and notification per crossing of the
projected finish — with a real daemon's steps, real command jobs and the real store."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401  (orch_home: the fixture)

from orchestrator.model.states import JobState

# A command job that plays a long job: it copies control.json to progress.json (the contract's
# heartbeat) whenever that changes, until a release file appears.
LONG_JOB = r"""
import json, os, sys, time
folder = sys.argv[1]
run_dir = os.environ["ORCH_RUN_DIR"]
last = None
while not os.path.exists(os.path.join(folder, "release-long")):
    try:
        text = open(os.path.join(folder, "control.json")).read()
    except OSError:
        text = None
    if text and text != last:
        body = dict(json.loads(text), updated_at=time.time())
        tmp = os.path.join(run_dir, "progress.json.tmp")
        open(tmp, "w").write(json.dumps(body))
        os.replace(tmp, os.path.join(run_dir, "progress.json"))
        last = text
    time.sleep(0.05)
"""


def iso(at: datetime) -> str:
    return at.isoformat(timespec="minutes")


def deadline_job(h: OrchHome, name: str, deadline: str, **extra: str) -> Path:
    path = h.jobs_dir / f"{name}.toml"
    lines = [
        f"name = {json.dumps(name)}",
        "gpus = 0",
        "retries = 0",
        f"command = {json.dumps([sys.executable, '-c', 'pass'])}",
        f"deadline = {json.dumps(deadline)}",
    ]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def control(h: OrchHome, step: int, total: int) -> None:
    tmp = h.tmp / "control.json.tmp"
    tmp.write_text(json.dumps({"step": step, "total_steps": total}))
    tmp.replace(h.tmp / "control.json")


# -- job.toml ------------------------------------------------------------------------------


def test_a_deadline_without_a_time_zone_or_in_the_past_is_refused_with_exit_2(orch, write_file, job_count):
    no_zone = write_file("a.toml", 'gpus = 0\ncommand = ["true"]\ndeadline = "2030-12-05T18:00"\n')
    ran = orch("submit", no_zone)
    assert ran.rc == 2 and "deadline" in ran.err and "time zone" in ran.err and "Traceback" not in ran.err, ran.err
    past = write_file("b.toml", 'gpus = 0\ncommand = ["true"]\ndeadline = "2020-01-01T00:00+08:00"\n')
    ran = orch("submit", past)
    assert ran.rc == 2 and "already past" in ran.err and "b.toml" in ran.err, ran.err
    assert job_count() == 0
    ok = write_file("c.toml", 'gpus = 0\ncommand = ["true"]\ndeadline = 2030-12-05T18:00:00+08:00\n')  # a TOML datetime
    ran = orch("submit", ok, "--json")
    assert ran.rc == 0, ran.err
    assert job_count() == 1


# -- earliest deadline first ---------------------------------------------------------------------


def test_a_deadline_job_of_equal_priority_submitted_later_starts_before_one_without(orch_home):
    h = orch_home(cpu_slots=1)
    d = h.local_daemon()
    blocker = h.submit("blocker", hold="blocker")
    h.tick_until(d, lambda: h.state(blocker) is JobState.RUNNING, what="the blocker to run")
    plain = h.submit("plain")
    soon = iso(datetime.now(timezone.utc) + timedelta(days=2))
    dl = h.submit(deadline_job(h, "dl", soon))
    late_dl = h.submit(deadline_job(h, "late-dl", iso(datetime.now(timezone.utc) + timedelta(days=3))))
    urgent = h.submit(deadline_job(h, "low-priority-dl", soon, priority="-1"))
    h.release("blocker")
    order = []

    def all_done() -> bool:
        d.tick()
        for job_id in (plain, dl, late_dl, urgent):
            if h.job(job_id).started_at is not None and job_id not in order:
                order.append(job_id)
        return len(order) == 4

    wait_for(all_done, 60, what="every job to start", interval=0.1)
    assert order == [dl, late_dl, plain, urgent], order  # priority first, then the earliest deadline, then none


# -- deadline_at_risk --------------------------------------------------------------------------------


def test_a_deadline_job_behind_a_long_job_raises_one_event_and_one_notification_per_crossing(orch_home):
    h = orch_home(cpu_slots=1)
    h.configure(
        {"notifiers": [{"type": "webhook", "name": "hook", "url": "http://127.0.0.1:9/x"}], "daemon": {"cpu_slots": 1}}
    )
    d = h.local_daemon()
    # A finished job of the deadline job's name: its run time is what the deadline job will take.
    earlier = h.submit("dl", sleep=0.5)
    h.tick_until(d, lambda: h.state(earlier) is JobState.SUCCEEDED, what="the earlier dl to finish")
    assert h.job(earlier).run_seconds > 0

    script = h.tmp / "long.py"
    script.write_text(LONG_JOB)
    control(h, 1, 100_000)  # a long way to go
    long_job = h.jobs_dir / "long.toml"
    long_job.write_text(
        f'name = "long"\ngpus = 0\nretries = 0\ncommand = {json.dumps([sys.executable, str(script), str(h.tmp)])}\n'
    )
    long_id = h.submit(long_job)
    h.tick_until(d, lambda: (h.run_dir(long_id) / "progress.json").exists(), what="the long job's progress")

    dl = h.submit(deadline_job(h, "dl", iso(datetime.now(timezone.utc) + timedelta(hours=1))))

    def events(kind: str) -> list:
        return h.store.events(dl, kinds=[kind])

    def notifications() -> list[dict]:
        rows = h.store.db.execute("SELECT payload FROM outbox WHERE job_id=?", (dl,)).fetchall()
        return [p for p in (json.loads(r[0]) for r in rows) if p["event"] == "deadline_at_risk"]

    h.tick_until(d, lambda: events("deadline_at_risk"), what="a deadline_at_risk event")
    for _ in range(5):
        d.tick()
    (event,) = events("deadline_at_risk")
    assert "after its deadline" in event.detail and "queue ahead" in event.detail and "priority" in event.detail, (
        event.detail
    )
    assert len(notifications()) == 1
    assert "projected to finish" in notifications()[0]["reason"]

    row = next(r for r in h.cli_json("status") if r["id"] == dl)
    assert row["deadline_at_risk"] is True and row["projected_finish"] > row["submitted_at"] + 3600
    shown = h.cli("show", str(dl))
    assert "deadline:" in shown.stdout and "LATE" in shown.stdout, shown.stdout

    control(h, 99_999, 100_000)  # nearly done: the deadline job would start at once and end in time
    h.tick_until(d, lambda: events("deadline_recovered"), what="the projection to recover")
    for _ in range(3):
        d.tick()
    assert len(events("deadline_at_risk")) == 1 and len(notifications()) == 1
    row = next(r for r in h.cli_json("status") if r["id"] == dl)
    assert row["deadline_at_risk"] is False

    control(h, 100_000, 10**12)  # the long job turns out far longer: a second crossing, told again
    h.tick_until(d, lambda: len(events("deadline_at_risk")) == 2, what="a second deadline_at_risk")
    for _ in range(3):
        d.tick()
    assert len(events("deadline_at_risk")) == 2 and len(notifications()) == 2
    h.release("long")
