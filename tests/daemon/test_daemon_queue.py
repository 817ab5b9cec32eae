"""The real daemon's dispatch: priority order, CPU and GPU slots, --after and --at."""

from __future__ import annotations

import json

import pytest
from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)

from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    for _, delta in points:  # at equal times an end (-1) sorts before a start (+1)
        cur += delta
        best = max(best, cur)
    return best


def test_queued_jobs_start_by_priority_then_submit_order(orch_home):
    h = orch_home()
    d = h.local_daemon()  # the daemon's steps in this process: the test ticks it
    blocker = h.submit("blocker", hold="blocker")
    h.tick_state(d, blocker, JobState.RUNNING)
    ids = {name: h.submit(name, priority=prio) for name, prio in [("low", 0), ("high-a", 5), ("mid", 1), ("high-b", 5)]}
    for _ in range(3):  # ticks while the only CPU slot is busy: nothing starts
        d.tick()
    assert all(h.state(i) is JobState.QUEUED for i in ids.values())
    h.release("blocker")
    for i in ids.values():
        h.tick_state(d, i, JobState.SUCCEEDED)
    order = sorted(ids, key=lambda n: h.store.attempts(ids[n])[0].started_at)
    assert order == ["high-a", "high-b", "mid", "low"]
    starts = [h.wait_record(n)["t"] for n in order]
    assert starts == sorted(starts)
    # One queue_drained event once everything ended, none while work was queued.
    drained = h.tick_until(d, lambda: h.store.events(kinds=["queue_drained"]), what="queue_drained")
    assert len(drained) == 1 and drained[0].at >= h.job(ids["low"]).finished_at


def test_two_cpu_slots_run_two_jobs_at_once_and_never_three(orch_home):
    h = orch_home(cpu_slots=2)
    d = h.local_daemon()
    ids = [h.submit(f"j{i}", hold="go", sleep=0.3) for i in range(5)]
    h.tick_until(d, lambda: len(h.records(event="start")) >= 2, 20, what="two jobs to start")
    for _ in range(5):  # ticks with three jobs queued and both slots busy: none of them may start
        d.tick()
    assert len(h.records(event="start")) == 2
    assert sorted(h.state(i).value for i in ids) == ["queued"] * 3 + ["running"] * 2
    h.release("go")
    for i in ids:
        h.tick_until(d, lambda: h.state(i) is JobState.SUCCEEDED, 30, what=f"job {i} to succeed")
    intervals = [(h.wait_record(f"j{n}", "start")["t"], h.wait_record(f"j{n}", "end")["t"]) for n in range(5)]
    assert max_overlap(intervals) == 2
    # The supervisors' own view (attempt-1.exit) agrees: never three attempts alive together.
    spans = [(h.exit_record(i, 1)["started_at"], h.exit_record(i, 1)["ended_at"]) for i in ids]
    assert max_overlap(spans) == 2


def test_after_a_dependency_succeeds_the_dependent_runs_after_it(orch_home):
    h = orch_home(cpu_slots=2)  # a free slot: only the dependency holds the dependent back
    d = h.local_daemon()
    dep = h.submit("dep", hold="dep")
    child = h.submit("child", after=(dep,))
    h.tick_until(d, lambda: h.state(dep) is JobState.RUNNING, what="the dependency to start")
    for _ in range(5):  # ticks with a free slot: the dependent must still wait
        d.tick()
    assert h.state(child) is JobState.QUEUED
    status = json.loads(h.cli("status", "--json").stdout)
    assert next(r for r in status if r["id"] == child)["reason"] == f"waiting for job {dep} to succeed"
    h.release("dep")
    h.tick_until(d, lambda: h.state(child) is JobState.SUCCEEDED, what="the dependent to succeed")
    assert h.wait_record("child")["t"] >= h.wait_record("dep", "end")["t"]
    assert h.store.attempts(child)[0].started_at >= h.exit_record(dep, 1)["ended_at"]


def test_after_a_dependency_fails_the_dependent_fails_with_the_reason(orch_home):
    h = orch_home()
    d = h.local_daemon()
    dep = h.submit("dep", exit=3)
    child = h.submit("child", after=(dep,))
    h.tick_state(d, dep, JobState.FAILED)
    job = h.tick_state(d, child, JobState.FAILED)
    assert job.reason == f"dependency {dep} failed"
    assert job.attempt == 0 and not h.records("child")
    shown = h.cli("show", str(child))
    assert shown.returncode == 0 and f"dependency {dep} failed" in shown.stdout
    data = json.loads(h.cli("show", str(child), "--json").stdout)
    assert data["state"] == "failed"
    assert any(e["kind"] == "failed" and e["detail"] == f"dependency {dep} failed" for e in data["events"])


def test_at_holds_a_job_until_its_time(orch_home):
    h = orch_home()
    h.start_daemon()
    result = h.cli("submit", str(h.job_file("later")), "--at", "+2s", "--json")
    assert result.returncode == 0, result.stderr
    job_id = json.loads(result.stdout)["id"]
    not_before = h.job(job_id).not_before
    assert not_before is not None
    status = json.loads(h.cli("status", "--json").stdout)
    assert "(--at)" in status[0]["reason"] and status[0]["state"] == "queued"
    h.wait_state(job_id, JobState.SUCCEEDED, timeout=60)  # released once its time has come
    started = h.store.attempts(job_id)[0].started_at
    assert started >= not_before
    assert h.wait_record("later")["t"] >= not_before


def test_gpu_slots_from_config_are_handed_out_without_nvidia_smi(orch_home):
    h = orch_home(gpus=[0, 1], gpus_on_cpu=True)
    d = h.local_daemon()
    a = h.submit("a", gpus=1, hold="a")
    b = h.submit("b", gpus=1, hold="b")
    both = h.submit("both", gpus=2)
    h.tick_until(d, lambda: h.state(a) is JobState.RUNNING and h.state(b) is JobState.RUNNING, what="a and b to run")
    seen = {h.wait_record("a")["env"]["CUDA_VISIBLE_DEVICES"], h.wait_record("b")["env"]["CUDA_VISIBLE_DEVICES"]}
    assert seen == {"0", "1"}
    h.release("a")
    h.tick_until(d, lambda: h.state(a) is JobState.SUCCEEDED, what="a to succeed")
    for _ in range(5):  # ticks with one GPU free: the 2-GPU job must keep waiting
        d.tick()
    assert h.state(both) is JobState.QUEUED
    h.release("b")
    h.tick_until(d, lambda: h.state(both) is JobState.SUCCEEDED, what="the 2-GPU job to succeed")
    assert h.wait_record("both")["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert h.store.attempts(both)[0].gpu_ids == [0, 1]
    assert h.store.attempts(both)[0].started_at >= h.exit_record(b, 1)["ended_at"]


def test_a_waiting_multi_gpu_job_is_not_overtaken_by_later_single_gpu_jobs(orch_home):
    h = orch_home(gpus=[0, 1], gpus_on_cpu=True)
    d = h.local_daemon()
    a = h.submit("a", gpus=1, hold="a")
    b = h.submit("b", gpus=1, hold="b")
    h.tick_until(d, lambda: h.state(a) is JobState.RUNNING and h.state(b) is JobState.RUNNING, what="a and b to run")
    both = h.submit("both", gpus=2, priority=5)
    small = h.submit("small", gpus=1, hold="small")  # lower priority, submitted later
    h.release("a")
    h.tick_until(d, lambda: h.state(a) is JobState.SUCCEEDED, what="a to succeed")
    cpu = h.submit("cpu", gpus=0)  # a CPU job is never held back by GPU jobs waiting for GPUs
    h.tick_until(d, lambda: h.state(cpu) is JobState.SUCCEEDED, what="the CPU job to succeed")
    for _ in range(5):  # ticks with GPU 0 free: it is kept for the 2-GPU job, not handed to "small"
        d.tick()
    assert h.state(small) is JobState.QUEUED and h.state(both) is JobState.QUEUED
    h.release("b")
    h.tick_until(d, lambda: h.state(both) is JobState.SUCCEEDED, what="the 2-GPU job to succeed")
    h.release("small")
    h.tick_until(d, lambda: h.state(small) is JobState.SUCCEEDED, what="small to succeed")
    assert h.store.attempts(small)[0].started_at >= h.store.attempts(both)[0].started_at
