"""The other ways a notice can go: `on_notice = "exit"` checkpoints every job and the daemon exits
by itself (the next daemon resumes them), and an AWS rebalance recommendation is an early
warning recorded as a `notice` event that stops nothing."""

from __future__ import annotations

import json

import pytest
from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)
from test_preemption_cloud_e2e import configure_preemption, wait_polls
from metadata_fakes import FakeAws, serve  # noqa: F401  (fixture)

from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


def test_on_notice_exit_checkpoints_requeues_and_the_daemon_exits(orch_home):
    h = orch_home(grace_seconds=10)
    configure_preemption(h, sources=["file"], poll_seconds=0.2, on_notice="exit")
    daemon = h.start_daemon()
    job_id = h.submit("spot", per_attempt={"1": {"hold": "never", "on_term": 75, "notice_ckpt": 5}, "2": {}})
    h.wait_record("spot", attempt=1)

    notice = h.root / "preempt-notice"
    notice.write_text("")
    assert daemon.wait(timeout=30) == 0, h.log_tail(30)  # the daemon left by itself, cleanly
    job = h.job(job_id)
    assert job.state is JobState.QUEUED and job.failures == 0
    assert [a.outcome for a in h.store.attempts(job_id)] == ["preempted"]

    notice.unlink()
    h.start_daemon()
    start = h.wait_record("spot", attempt=2)
    assert start["env"]["ORCH_RESUME_FROM"].endswith("notice-step-00000005.ckpt")
    assert h.wait_state(job_id, JobState.SUCCEEDED).attempt == 2


def test_aws_rebalance_is_an_early_warning_that_stops_nothing(orch_home, serve):
    fake = FakeAws()
    h = orch_home()
    configure_preemption(h, sources=["aws"], poll_seconds=0.2, timeout_seconds=0.5, aws_endpoint=serve(fake))
    h.start_daemon()
    job_id = h.submit("steady", hold="go", on_term=75)
    h.wait_record("steady", attempt=1)
    fake.rebalance = (200, json.dumps({"noticeTime": "2026-11-29T10:00:00Z"}))
    wait_for(lambda: any(e.kind == "notice" for e in h.store.events()), 15, what="the notice event")
    wait_polls(fake, 5, "aws")
    notices = [e for e in h.store.events() if e.kind == "notice"]
    assert len(notices) == 1 and "rebalance" in notices[0].detail  # once per distinct noticeTime
    assert h.state(job_id) is JobState.RUNNING
    assert not (h.tmp / "term-steady#1").exists()  # no SIGTERM
    h.release("go")
    assert h.wait_state(job_id, JobState.SUCCEEDED).attempt == 1
