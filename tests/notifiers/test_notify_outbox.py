"""The outbox delivery engine with the real Store and real channels talking to a loopback
provider: backoff, Retry-After, giving up, per-channel spacing, at-least-once. Time is
injected as `now`; nothing sleeps."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from notifiers import Message, NotifyError, build_notifiers
from orchestrator.jobs.outbox import OutboxSender
from orchestrator.model.records import Outgoing
from orchestrator.store import Store

KEY = "693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa"
OK = {"errcode": 0, "errmsg": "ok"}


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store(tmp_path / "orch.db")
    yield s
    s.close()


def channels(provider: Any) -> dict[str, Any]:
    built = build_notifiers(
        [
            {"type": "wecom", "url": f"{provider.base_url}/cgi-bin/webhook/send?key={KEY}"},
            {"type": "webhook", "name": "hook", "url": f"{provider.base_url}/hook"},
        ],
        env={},
        timeout_s=2,
    )
    return {n.name: n for n in built}


def queue(store: Any, channel: str, now: float, event: str = "failed", job_id: int | None = None) -> int:
    if job_id is None:
        job_id = store.submit(
            name="sst2-bert", kind="command", gpus=0, priority=0, retries=0, spec={}, spec_path="", now=now
        ).id
    message = Message(event, job_id=job_id, job_name="sst2-bert")
    store.record_event(job_id, event, now, outgoing=[Outgoing(channel, message.to_dict())])
    return job_id


def row(store: Any, index: int = 0) -> Any:
    return store.outbox()[index]


def test_an_accepted_message_is_marked_delivered_and_never_resent(store: Any, provider: Any) -> None:
    provider.reply(200, OK)
    queue(store, "wecom", now=100.0)
    sender = OutboxSender(store, channels(provider))
    assert sender.deliver_due(100.0) == 1
    assert row(store).delivered_at == 100.0
    assert sender.deliver_due(200.0) == 0 and sender.deliver_due(10_000.0) == 0
    assert len(provider.requests) == 1
    assert "[orch] job 1 sst2-bert failed" in provider.last.json()["markdown"]["content"]


def test_retryable_errors_back_off_exponentially_up_to_the_cap(store: Any, provider: Any) -> None:
    provider.reply(500, "busy")
    queue(store, "wecom", now=0.0)
    sender = OutboxSender(store, channels(provider), base_backoff_s=5, max_backoff_s=30)
    now, waits = 0.0, []
    for _ in range(6):
        assert sender.deliver_due(now) == 0
        waits.append(row(store).next_try_at - now)
        assert sender.deliver_due(row(store).next_try_at - 0.5) == 0  # not due yet: nothing sent
        now = row(store).next_try_at
    assert waits == [5, 10, 20, 30, 30, 30]
    assert len(provider.requests) == 6 and row(store).tries == 6
    assert "HTTP 500" in row(store).last_error and row(store).gave_up_at is None
    provider.reply(200, OK)
    assert sender.deliver_due(now) == 1 and row(store).delivered_at == now


def test_the_providers_retry_after_wins_over_a_shorter_backoff(store: Any, provider: Any) -> None:
    provider.reply(200, {"errcode": 45009, "errmsg": "api freq out of limit"})
    queue(store, "wecom", now=0.0)
    OutboxSender(store, channels(provider), base_backoff_s=5).deliver_due(0.0)
    assert row(store).next_try_at == 60.0 and row(store).gave_up_at is None


def test_a_permanent_error_gives_up_at_once_and_tells_the_job_history(
    store: Any, provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    provider.reply(200, {"errcode": 93000, "errmsg": "invalid webhook url"})
    job_id = queue(store, "wecom", now=0.0)
    with caplog.at_level(logging.WARNING, logger="orch.outbox"):
        assert OutboxSender(store, channels(provider)).deliver_due(0.0) == 0
    assert row(store).gave_up_at == 0.0 and row(store).tries == 1
    (event,) = store.events(job_id, kinds=["notify_failed"])
    assert event.detail.startswith("wecom: invalid webhook url (code 93000) (permanent:")
    assert KEY not in event.detail and KEY not in caplog.text
    assert "given up" in caplog.text and "job 1" in caplog.text
    assert OutboxSender(store, channels(provider)).deliver_due(1000.0) == 0
    assert len(provider.requests) == 1


def test_retryable_failures_give_up_once_the_message_is_too_old(store: Any, provider: Any) -> None:
    provider.reply(503, "down")
    job_id = queue(store, "wecom", now=0.0)
    sender = OutboxSender(store, channels(provider), max_age_s=100, base_backoff_s=10, max_backoff_s=40)
    now = 0.0
    while row(store).gave_up_at is None:
        sender.deliver_due(now)
        now = row(store).next_try_at
    # Tries at 0, 10, 30, 70; the next would be at 110 > 100 s after creation.
    assert row(store).tries == 4 and row(store).gave_up_at == 70.0
    (event,) = store.events(job_id, kinds=["notify_failed"])
    assert "still failing after 1m" in event.detail and "HTTP 503" in event.detail


def test_each_channel_is_spaced_by_its_min_interval(store: Any, provider: Any) -> None:
    provider.reply(200, OK)
    job_id = queue(store, "wecom", now=0.0, event="started")
    queue(store, "wecom", now=0.0, event="preempted", job_id=job_id)
    queue(store, "wecom", now=0.0, event="resumed", job_id=job_id)
    for event in ("started", "preempted", "resumed"):
        queue(store, "hook", now=0.0, event=event, job_id=job_id)
    sender = OutboxSender(store, channels(provider))
    # WeCom allows 20 a minute (one per 3 s); the generic webhook has no limit.
    assert sender.deliver_due(0.0) == 1 + 3
    assert sender.deliver_due(2.9) == 0
    assert sender.deliver_due(3.0) == 1
    assert sender.deliver_due(5.0) == 0
    assert sender.deliver_due(6.0) == 1
    wecom = [r.json()["markdown"]["content"] for r in provider.requests if r.path.startswith("/cgi-bin")]
    assert [c.splitlines()[0] for c in wecom] == [
        "**[orch] job 1 sst2-bert started**",
        "**[orch] job 1 sst2-bert was preempted**",
        "**[orch] job 1 sst2-bert resumed from a checkpoint**",
    ]


def test_a_failing_row_holds_back_later_rows_of_its_channel_only(store: Any, provider: Any) -> None:
    provider.reply(200, OK)
    provider.then(500, "busy")  # the first request (wecom row 1) fails
    job_id = queue(store, "wecom", now=0.0, event="started")
    queue(store, "wecom", now=0.0, event="succeeded", job_id=job_id)
    queue(store, "hook", now=0.0, event="succeeded", job_id=job_id)
    sender = OutboxSender(store, channels(provider))
    assert sender.deliver_due(0.0) == 1  # the webhook; wecom's "succeeded" waits behind "started"
    rows = store.outbox()
    assert [r.delivered_at for r in rows] == [None, None, 0.0]
    assert sender.deliver_due(5.0) == 1 and sender.deliver_due(8.0) == 1
    assert [r.delivered_at for r in store.outbox()] == [5.0, 8.0, 0.0]


def test_a_row_for_a_channel_no_longer_configured_is_given_up(store: Any, provider: Any) -> None:
    job_id = queue(store, "old-dingtalk", now=0.0)
    assert OutboxSender(store, channels(provider)).deliver_due(0.0) == 0
    assert row(store).gave_up_at == 0.0
    (event,) = store.events(job_id, kinds=["notify_failed"])
    assert "channel 'old-dingtalk' is no longer configured" in event.detail


class CrashingChannel:
    """A channel with a bug (raises something other than NotifyError)."""

    name, type, events, min_interval_s = "buggy", "webhook", frozenset({"failed"}), 0.0

    def send(self, message: Message) -> None:
        raise KeyError("boom")

    def describe(self) -> str:
        return "buggy"


def test_a_crashing_channel_is_retried_and_never_stops_delivery(store: Any, provider: Any) -> None:
    provider.reply(200, OK)
    job_id = queue(store, "buggy", now=0.0)
    queue(store, "wecom", now=0.0, job_id=job_id)
    sender = OutboxSender(store, {**channels(provider), "buggy": CrashingChannel()})
    assert sender.deliver_due(0.0) == 1
    buggy = row(store, 0)
    assert buggy.next_try_at == 5.0 and "KeyError" in buggy.last_error


def test_one_sender_keeps_a_channels_spacing_between_passes(store: Any, provider: Any) -> None:
    provider.reply(200, OK)
    job_id = queue(store, "wecom", now=0.0)
    queue(store, "wecom", now=0.0, job_id=job_id)
    sender = OutboxSender(store, channels(provider))
    assert sender.deliver_due(0.0) == 1
    assert sender.deliver_due(1.0) == 0
    assert sender.deliver_due(3.0) == 1


def test_notify_error_is_what_channels_raise() -> None:
    # The engine's contract with channels, checked on a real one.
    (notifier,) = build_notifiers([{"type": "webhook", "url": "http://127.0.0.1:9/x"}], env={}, timeout_s=1)
    with pytest.raises(NotifyError):
        notifier.send(Message("failed"))


def test_a_long_backlog_on_one_channel_never_delays_another(store: Any, provider: Any) -> None:
    """A channel that was down for a day can hold more rows than one pass reads; the other
    channels' messages must still go out in the same pass."""
    provider.reply(200, OK)
    job_id = queue(store, "wecom", now=0.0, event="started")
    for _ in range(600):  # more than one pass reads of a channel
        queue(store, "wecom", now=0.0, event="retrying", job_id=job_id)
    queue(store, "hook", now=0.0, event="succeeded", job_id=job_id)
    sender = OutboxSender(store, channels(provider))
    # WeCom's spacing (20 a minute) lets one of its rows out per pass; the webhook is not held up.
    assert sender.deliver_due(0.0) == 2
    rows = store.outbox()
    assert rows[-1].channel == "hook" and rows[-1].delivered_at == 0.0
    assert [r.delivered_at for r in rows[:2]] == [0.0, None]
