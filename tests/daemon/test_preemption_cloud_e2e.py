"""A real daemon polling loopback metadata servers that speak AWS IMDSv2, GCP metadata and Azure
Scheduled Events: when a server flips to "preempted", every running job is SIGTERMed, checkpoints,
and goes back to the queue; nothing starts while the notice stands; once it clears the jobs run
again and resume from their checkpoints. A metadata server that fails (HTTP 500) or cannot be
reached is "I don't know", never a notice: the jobs keep running."""

from __future__ import annotations

import json
import time
from email.utils import format_datetime
from datetime import datetime, timezone
from typing import Any, Callable

import pytest
from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401  (fixture)
from metadata_fakes import Fake, FakeAws, FakeAzure, FakeGcp, closed_port_url, serve  # noqa: F401

from orchestrator.spec.config import load_config
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow

POLL_S = 0.2


def configure_preemption(h: OrchHome, **preemption: Any) -> None:
    """Add a [preemption] section to the home's config.toml (JSON scalars and lists are TOML too)."""
    config = h.root / "config.toml"
    lines = ["", "[preemption]"] + [f"{k} = {json.dumps(v)}" for k, v in preemption.items()]
    config.write_text(config.read_text() + "\n".join(lines) + "\n")
    h.config = load_config(config, required=True)


def _iso_in(seconds: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def aws_flip(fake: FakeAws, on: bool) -> None:
    fake.instance_action = (
        (200, json.dumps({"action": "terminate", "time": _iso_in(120)})) if on else (404, "<html>Not Found</html>")
    )


def gcp_flip(fake: FakeGcp, on: bool) -> None:
    fake.preempted = "TRUE" if on else "FALSE"


def azure_flip(fake: FakeAzure, on: bool) -> None:
    if on:
        not_before = format_datetime(datetime.fromtimestamp(time.time() + 30, timezone.utc), usegmt=True)
        fake.add_event(
            EventId="602d9444-d2cd-49c7-8624-8643e7171297",
            EventType="Preempt",
            ResourceType="VirtualMachine",
            Resources=["spot-vm-0"],
            EventStatus="Scheduled",
            NotBefore=not_before,
            Description="Spot eviction",
            EventSource="Platform",
            DurationInSeconds=-1,
        )
    else:
        fake.events = []
        fake.incarnation += 1


PROVIDERS: dict[str, tuple[Callable[[], Fake], Callable[[Any, bool], None]]] = {
    "aws": (FakeAws, aws_flip),
    "gcp": (FakeGcp, gcp_flip),
    "azure": (FakeAzure, azure_flip),
}


def polls(fake: Fake) -> int:
    """GET requests the daemon made (AWS's token PUTs aside)."""
    return sum(1 for method, _, _ in fake.requests if method == "GET")


def wait_polls(fake: Fake, more: int, what: str) -> None:
    target = polls(fake) + more
    wait_for(lambda: polls(fake) >= target, 15, what=f"{more} more polls of the {what} metadata server")


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_metadata_notice_checkpoints_and_requeues_every_job_and_they_resume_when_it_clears(provider, orch_home, serve):
    make_fake, flip = PROVIDERS[provider]
    fake = make_fake()
    h = orch_home(cpu_slots=2, grace_seconds=10)
    configure_preemption(
        h,
        sources=[provider],
        poll_seconds=POLL_S,
        timeout_seconds=0.5,
        on_notice="wait",
        **{f"{provider}_endpoint": serve(fake)},
    )
    h.start_daemon()
    jobs = {
        name: h.submit(
            name, per_attempt={"1": {"hold": "never", "on_term": 75, "notice_ckpt": step}, "2": {"hold": f"go-{name}"}}
        )
        for name, step in (("first", 7), ("second", 3))
    }
    for name in jobs:
        h.wait_record(name, attempt=1)
    wait_polls(fake, 3, provider)  # "no notice" answers: nothing happens
    assert all(h.state(j) is JobState.RUNNING for j in jobs.values())

    flip(fake, True)
    for job_id in jobs.values():
        h.wait_state(job_id, JobState.QUEUED)
    wait_polls(fake, 5, provider)  # the notice stands: the queue is held
    for name, job_id in jobs.items():
        job = h.job(job_id)
        assert job.state is JobState.QUEUED and job.attempt == 1 and job.failures == 0, (name, job.state, job.reason)
        assert (h.tmp / f"term-{name}#1").exists(), f"{name} never got SIGTERM"
        show = json.loads(h.cli("show", str(job_id), "--json").stdout)
        assert [a["outcome"] for a in show["attempts"]] == ["preempted"]
        assert show["attempts"][0]["exit_code"] == 75
        preempted = [e for e in show["events"] if e["kind"] == "preempted"]
        assert len(preempted) == 1 and provider in preempted[0]["detail"], show["events"]
    assert all(r["attempt"] == 1 for r in h.records(event="start")), "a job started while the notice stood"

    flip(fake, False)
    for name, job_id in jobs.items():
        start = h.wait_record(name, attempt=2)
        assert h.state(job_id) is JobState.RUNNING
        step = 7 if name == "first" else 3
        assert start["env"]["ORCH_RESUME_FROM"] == str(
            h.run_dir(job_id) / "checkpoints" / f"notice-step-{step:08d}.ckpt"
        )
        h.release(f"go-{name}")
    for name, job_id in jobs.items():
        h.wait_state(job_id, JobState.SUCCEEDED)
        show = json.loads(h.cli("show", str(job_id), "--json").stdout)
        attempts = show["attempts"]
        assert [a["outcome"] for a in attempts] == ["preempted", "succeeded"], attempts
        assert attempts[1]["resumed_from_step"] == (7 if name == "first" else 3)
        kinds = [e["kind"] for e in show["events"]]
        assert kinds.index("preempted") < kinds.index("resumed") < kinds.index("succeeded"), kinds


class Broken(Fake):
    """A metadata server having a bad day: every request is an HTTP 500."""

    def reply(self, method, path, headers, body):
        return 500, "Internal Server Error"


def _assert_jobs_unbothered(h: OrchHome, job_id: int, seconds_or_fake: Any) -> None:
    h.wait_record("steady", attempt=1)
    if isinstance(seconds_or_fake, Fake):
        wait_polls(seconds_or_fake, 3 * len(PROVIDERS), "broken")
    else:
        # Nothing to count on a closed port: the daemon's log says it tried, and it counts its polls.
        wait_for(lambda: "cannot be read" in h.home.log_file.read_text(), 15, what="a failed poll in the daemon log")
        h.wait_ticks(0, notices=5)
    job = h.job(job_id)
    assert job.state is JobState.RUNNING and job.attempt == 1, (job.state, job.reason)
    assert not (h.tmp / "term-steady#1").exists(), "the job got SIGTERM"
    h.release("steady")
    h.wait_state(job_id, JobState.SUCCEEDED)
    kinds = h.event_kinds(job_id)
    assert "preempted" not in kinds and "notice" not in kinds, kinds
    assert [a.outcome for a in h.store.attempts(job_id)] == ["succeeded"]


def test_metadata_servers_answering_500_are_not_a_notice(orch_home, serve):
    broken = Broken()
    url = serve(broken)
    h = orch_home()
    configure_preemption(
        h,
        sources=sorted(PROVIDERS),
        poll_seconds=POLL_S,
        timeout_seconds=0.5,
        **{f"{p}_endpoint": url for p in PROVIDERS},
    )
    h.start_daemon()
    job_id = h.submit("steady", hold="steady", on_term=75)
    _assert_jobs_unbothered(h, job_id, broken)
    assert {path.split("?")[0] for _, path, _ in broken.requests} >= {
        "/latest/api/token",
        "/computeMetadata/v1/instance/preempted",
        "/metadata/scheduledevents",
    }


def test_unreachable_metadata_servers_are_not_a_notice(orch_home, closed_port_url):
    h = orch_home()
    configure_preemption(
        h,
        sources=sorted(PROVIDERS),
        poll_seconds=POLL_S,
        timeout_seconds=0.5,
        **{f"{p}_endpoint": closed_port_url for p in PROVIDERS},
    )
    h.start_daemon()
    job_id = h.submit("steady", hold="steady", on_term=75)
    _assert_jobs_unbothered(h, job_id, None)
