"""`orch run` as a user runs it, with pricing, beside a daemon and alone (issue 28, defects 3 and 7):
exactly one process accrues a job's time and cost, by the daemon's formula; the daemon and `orch
run` never hand out the same GPU; Ctrl-C during a retry's backoff ends `orch run` at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401  (fixture)

from orchestrator.model.errors import InvalidTransition
from orchestrator.model.records import FOREGROUND_PID, AttemptStart
from orchestrator.model.states import EventKind, JobState

pytestmark = pytest.mark.slow

PER_SECOND = {"pricing": {"currency": "CNY", "gpu_hour": 3600.0, "instance_hour": 3600.0}}  # 1.0 a second


def _priced(h: OrchHome, **daemon) -> None:
    h.configure(PER_SECOND, **daemon)


def _wall(h: OrchHome, name: str) -> float:
    start, end = h.records(name, "start")[-1], h.records(name, "end")[-1]
    return end["t"] - start["t"]


def _attempt_span(h: OrchHome, job_id: int) -> float:
    """From the attempt row's start to its end: the most any one process may bill for it."""
    (attempt,) = h.store.attempts(job_id)
    assert attempt.ended_at is not None
    return attempt.ended_at - attempt.started_at


def _read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_a_lone_orch_run_is_charged_by_the_daemons_formula(orch_home):
    h = orch_home()
    _priced(h)
    res = h.cli("run", str(h.job_file("alone", sleep=3.0)))
    assert res.returncode == 0, res.stderr
    job = h.job(1)
    wall = _wall(h, "alone")
    # One CPU job on a GPU-less machine takes all of instance_hour: 1.0 a second of its runtime.
    assert wall <= job.run_seconds <= _attempt_span(h, 1) + 1e-6, (wall, job.run_seconds)  # + the job's start-up
    assert job.cost == pytest.approx(job.run_seconds, rel=1e-6), (job.cost, job.run_seconds)
    assert h.store.ledger().get("uptime_s", 0.0) == 0.0  # no daemon ran: no uptime, no idle


def test_orch_run_beside_a_daemon_is_counted_once(orch_home):
    h = orch_home()
    _priced(h)
    h.start_daemon()
    res = h.cli("run", str(h.job_file("beside", sleep=3.0)))
    assert res.returncode == 0, res.stderr
    job = h.job(1)
    wall = _wall(h, "beside")
    # not twice: never more than the attempt lasted (counted twice it would be about 2 x wall)
    assert wall <= job.run_seconds <= _attempt_span(h, 1) + 1e-6, (wall, job.run_seconds)
    assert job.cost == pytest.approx(job.run_seconds, rel=1e-6)
    # The daemon counted the job's share as busy, not idle (the daemon was up the whole 3 s the
    # job slept: at 1.0 a second, all idle would be the whole uptime), and charged it nothing itself.
    # Read once the daemon has accrued past the job's end: before that, its uptime covers only part
    # of the job, and the bound below (which subtracts the whole job) does not yet apply.
    ended = h.records("beside", "end")[-1]["t"]
    ledger = wait_for(
        lambda: (lg := h.store.ledger()).get("accrued_until", 0.0) >= ended and lg,
        120,
        lambda: f"the daemon to accrue past the job's end at {ended}: {h.store.ledger()}",
    )
    assert ledger["idle_cost"] <= ledger["uptime_s"] - wall + 1e-6, ledger


def test_orch_run_waits_for_a_gpu_the_daemon_holds(orch_home):
    h = orch_home(gpus=[0], gpus_on_cpu=True)
    _priced(h, gpus=[0])
    h.start_daemon()
    held = h.submit("daemon-job", gpus=1, hold="gpu")
    h.wait_record("daemon-job")
    fg_err = h.tmp / "fg.err"
    fg = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(h.root), "run", str(h.job_file("fg-job", gpus=1))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(fg_err, "w"),
        env=h.env(),
    )
    try:
        wait_for(lambda: len(h.store.jobs()) == 2, 30, what="orch run to record its job")
        # What it decided, observed: it says it waits (and so has not started the job), never a guess of time.
        wait_for(lambda: "waiting for 1 free GPU" in _read(fg_err), 30, what="orch run to say it waits")
        assert h.records("fg-job", "start") == [], "orch run started a job on the GPU the daemon's job holds"
        h.release("gpu")
        assert fg.wait(timeout=60) == 0, _read(fg_err)
    finally:
        if fg.poll() is None:
            fg.kill()
    assert h.wait_state(held, JobState.SUCCEEDED)
    assert h.records("fg-job", "start")[0]["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert h.records("fg-job", "start")[0]["t"] >= h.records("daemon-job", "end")[0]["t"]


def test_a_gpu_free_orch_run_waits_for_a_cpu_slot_the_daemon_holds(orch_home):
    """[daemon] cpu_slots bounds GPU-free jobs for the daemon and `orch run` alike (one choice,
    planning/dispatch.py): with the one slot taken by a daemon's job, `orch run` of a gpus = 0
    job says it waits and starts only when that job ends."""
    h = orch_home()
    _priced(h, cpu_slots=1)
    h.start_daemon()
    held = h.submit("daemon-cpu-job", gpus=0, hold="slot")
    h.wait_record("daemon-cpu-job")
    fg_err = h.tmp / "fg.err"
    fg = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(h.root), "run", str(h.job_file("fg-cpu", gpus=0))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(fg_err, "w"),
        env=h.env(),
    )
    try:
        wait_for(lambda: "waiting for a free CPU slot" in _read(fg_err), 30, what="orch run to say it waits")
        assert h.records("fg-cpu", "start") == [], "orch run started a GPU-free job past [daemon] cpu_slots"
        h.release("slot")
        assert fg.wait(timeout=60) == 0, _read(fg_err)
    finally:
        if fg.poll() is None:
            fg.kill()
    assert h.wait_state(held, JobState.SUCCEEDED)
    assert h.records("fg-cpu", "start")[0]["t"] >= h.records("daemon-cpu-job", "end")[0]["t"]


def test_the_store_refuses_to_start_two_attempts_on_one_gpu(orch_home):
    h = orch_home(gpus=[0, 1])
    a, b = h.submit("a", gpus=1), h.submit("b", gpus=1)
    now = time.time()
    h.store.transition(a, JobState.RUNNING, EventKind.STARTED, now, begin_attempt=AttemptStart(1, [0]))
    with pytest.raises(InvalidTransition, match="GPU 0 is held by job 1"):
        h.store.transition(b, JobState.RUNNING, EventKind.STARTED, now, begin_attempt=AttemptStart(1, [0]))
    assert h.store.get(b).state is JobState.QUEUED
    h.store.transition(b, JobState.RUNNING, EventKind.STARTED, now, begin_attempt=AttemptStart(1, [1]))


def test_ctrl_c_during_the_retry_backoff_ends_orch_run_at_once(orch_home):
    h = orch_home(retry_backoff_seconds=300)
    err_file = h.tmp / "run.err"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "--home",
                str(h.root),
                "run",
                str(h.job_file("flaky", retries=1, exit=3)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=h.env(),
        )
    try:
        wait_for(lambda: "retrying in" in err_file.read_text(), 30, what="orch run to wait for its retry")
        proc.send_signal(signal.SIGINT)  # what the terminal sends on Ctrl-C
        assert proc.wait(timeout=120) == 130  # at once: not after the 300 s backoff
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "orch run --resume 1" in err_file.read_text()
    assert h.state(1) is JobState.CANCELLED  # no daemon starts it later behind the user's back


def test_a_daemon_leaves_alone_a_job_orch_run_is_starting(orch_home):
    """Between `orch run` recording the attempt running and recording itself as its handle, a
    daemon's tick must not call the attempt lost (and start it a second time); once recorded, the
    daemon never charges it."""
    h = orch_home()
    _priced(h)
    d = h.local_daemon()
    job_id = h.submit(h.job_file("starting"))
    h.store.transition(job_id, JobState.RUNNING, EventKind.STARTED, time.time(), begin_attempt=AttemptStart(1))
    for _ in range(3):
        d.tick()
        time.sleep(0.1)
    job = h.job(job_id)
    assert job.state is JobState.RUNNING and job.attempt == 1, job.reason
    charged = job.run_seconds  # (the daemon may charge that instant: at most one tick's interval)
    h.store.update(job_id, time.time(), supervisor_pid=os.getpid(), executor_ref={FOREGROUND_PID: os.getpid()})
    d.tick()
    time.sleep(0.2)
    d.tick()
    job = h.job(job_id)
    assert job.state is JobState.RUNNING and job.run_seconds == charged  # orch run accrues it, not the daemon
    assert h.store.ledger()["uptime_s"] > 0  # the daemon did accrue its own uptime meanwhile


def _orch_run(h: OrchHome, *args: str) -> tuple[subprocess.Popen, Path]:
    """`orch run ARGS` in the background, its stderr to a file: (process, that file)."""
    err_file = h.tmp / "run.err"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "--home", str(h.root), "run", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=h.env(),
        )
    return proc, err_file


def _finish(proc: subprocess.Popen, err_file: Path) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, _read(err_file)


def test_a_lone_orch_run_stops_its_job_at_the_budget_and_a_bigger_one_finishes_it(orch_home):
    """No daemon to apply [budget]: `orch run` applies the daemon's rule itself. At 1.0 a second,
    a max_cost 2 above what the job has spent once it set its SIGTERM handler (its "start" record;
    a Python start-up can take seconds on a busy machine) stops the 30 s job about 2 s later (a
    checkpoint, then `stopped`)."""
    h = orch_home()
    _priced(h)
    path = h.job_file("capped", sleep=30.0, on_term=75, notice_ckpt=4, per_attempt={"2": {"sleep": 0.5}})
    path.write_text(path.read_text() + "\n[budget]\nmax_cost = 1000.0\n")
    proc, err_file = _orch_run(h, str(path))
    h.wait_record("capped", timeout=120)
    limit = h.job(1).cost + 2.0
    h.store.update(1, time.time(), max_cost=limit)  # as `orch retry --budget` sets it, in the store
    code, err = _finish(proc, err_file)
    assert code == 75, err  # the job's own exit after its checkpoint
    job = h.job(1)
    assert job.state is JobState.STOPPED and job.reason.startswith("budget: spent"), job.reason
    assert limit <= job.cost < 30.0, (limit, job.cost)  # stopped at the budget, long before the job's own 30 s
    assert h.records("capped", "sigterm"), "the job was told to checkpoint, not killed"
    assert "orch retry 1 --budget N" in err and "orch run --resume 1" in err, err
    assert "Traceback" not in err
    # a bigger budget: it resumes from its checkpoint and finishes
    assert h.cli("retry", "1", "--budget", "100").returncode == 0
    again = h.cli("run", "--resume", "1")
    assert again.returncode == 0, again.stderr
    assert h.job(1).state is JobState.SUCCEEDED
    resumed = h.records("capped", "start")[-1]
    assert resumed["attempt"] == 2 and resumed["env"]["ORCH_RESUME_FROM"].endswith("notice-step-00000004.ckpt")


def test_orch_run_starts_nothing_while_the_total_budget_is_spent(orch_home):
    """config.toml's [budget] total: the first job spends it (and is stopped there), after which
    `orch run` records and starts nothing, as a daemon would hold the queue. The spend is brought to
    1.5 short of the total once the job has set its SIGTERM handler; its running crosses it."""
    h = orch_home()
    h.configure({**PER_SECOND, "budget": {"total": 30.0}})
    proc, err_file = _orch_run(h, str(h.job_file("spends", sleep=20.0, on_term=75)))
    h.wait_record("spends", timeout=120)
    spent = h.store.total_cost()
    assert spent < 28.5, spent
    # spent before, as idle time in the ledger; `orch run`'s own accrual adds to it
    h.store.db.execute(
        "INSERT INTO ledger(key, value) VALUES('idle_cost', ?) ON CONFLICT(key) DO UPDATE SET value=value+excluded.value",
        (28.5 - spent,),
    )
    h.store.db.commit()
    code, err = _finish(proc, err_file)
    assert code == 75 and h.job(1).state is JobState.STOPPED, err
    assert h.records("spends", "sigterm"), "the job was told to checkpoint, not killed"
    assert "[budget] total is 30.00" in h.job(1).reason
    assert "raise [budget] total in config.toml, then `orch run --resume 1`" in err, err
    for args in (["run", str(h.job_file("next", sleep=0.1))], ["run", "--resume", "1"]):
        res = h.cli(*args)
        assert res.returncode == 1 and "nothing was started" in res.stderr and "[budget] total" in res.stderr, res
        assert "Traceback" not in res.stderr
    assert [j.id for j in h.store.jobs()] == [1] and not h.records("next")
    assert len(h.store.attempts(1)) == 1
