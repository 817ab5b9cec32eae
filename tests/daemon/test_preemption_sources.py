"""Preemption sources against real loopback HTTP servers that speak each provider's format
(AWS IMDSv2, GCP metadata, Azure Scheduled Events). The sentinel file, the watcher over all the
sources and building them from config are in test_notice_watcher.py."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from orchestrator.daemon.notice_watch import NoticeWatcher
from orchestrator.daemon.preemption import (
    MAINTENANCE,
    PREEMPT,
    REBALANCE,
    AwsSource,
    AzureSource,
    GcpSource,
    Notice,
    SourceUnavailable,
    parse_iso_utc,
)

NOW = 1_790_000_000.0
TIMEOUT_S = 0.25

from metadata_fakes import Fake, FakeAws, FakeAzure, FakeGcp, closed_port_url, serve  # noqa: E402,F401  (fixtures)


# --- AWS ---------------------------------------------------------------------------------


def test_aws_says_nothing_while_instance_action_is_404(serve):
    fake = FakeAws()
    source = AwsSource(serve(fake), timeout_s=TIMEOUT_S)
    assert source.poll(NOW) is None
    assert source.poll(NOW + 5) is None


def test_aws_fetches_one_token_with_a_ttl_and_reuses_it(serve):
    fake = FakeAws()
    source = AwsSource(serve(fake), timeout_s=TIMEOUT_S)
    for i in range(3):
        source.poll(NOW + 5 * i)
    assert fake.ttls == ["21600"]
    gets = [r for r in fake.requests if r[0] == "GET"]
    assert gets and all(r[2].get("x-aws-ec2-metadata-token") == "token-1" for r in gets)


def test_aws_fetches_a_new_token_after_401(serve):
    fake = FakeAws()
    source = AwsSource(serve(fake), timeout_s=TIMEOUT_S)
    source.poll(NOW)
    fake.revoke_tokens()
    fake.instance_action = (200, json.dumps({"action": "terminate", "time": "2026-09-18T08:22:00Z"}))
    notice = source.poll(NOW + 5)
    assert notice is not None and notice.kind == PREEMPT
    assert len(fake.ttls) == 2


def test_aws_refreshes_the_token_before_it_expires(serve):
    fake = FakeAws()
    source = AwsSource(serve(fake), timeout_s=TIMEOUT_S)
    source.poll(NOW)
    source.poll(NOW + AwsSource.TOKEN_TTL_S - 30)
    assert len(fake.ttls) == 2


def test_aws_without_a_token_the_server_refuses(serve):
    """The fake is strict the way IMDSv2-only instances are, so the token path above is real."""
    import httpx

    url = serve(FakeAws())
    assert httpx.get(url + "/latest/meta-data/spot/instance-action").status_code == 401
    assert httpx.put(url + "/latest/api/token").status_code == 400


@pytest.mark.parametrize("action", ["terminate", "stop", "hibernate"])
def test_aws_instance_action_is_a_preempt_notice_with_its_deadline(serve, action):
    fake = FakeAws()
    source = AwsSource(serve(fake), timeout_s=TIMEOUT_S)
    assert source.poll(NOW) is None
    fake.instance_action = (200, json.dumps({"action": action, "time": "2026-09-18T08:22:00Z"}))
    notice = source.poll(NOW + 5)
    assert notice == Notice(
        "aws",
        PREEMPT,
        parse_iso_utc("2026-09-18T08:22:00Z"),
        f"AWS spot interruption: {action} at 2026-09-18T08:22:00Z",
    )
    assert notice.deadline == 1789719720.0


def test_aws_rebalance_is_an_early_warning_reported_once_per_notice_time(serve):
    fake = FakeAws()
    source = AwsSource(serve(fake), timeout_s=TIMEOUT_S)
    fake.rebalance = (200, json.dumps({"noticeTime": "2026-09-18T08:17:00Z"}))
    first = source.poll(NOW)
    assert first is not None and first.kind == REBALANCE and first.deadline is None
    assert not first.stops_jobs
    assert source.poll(NOW + 5) is None
    fake.rebalance = (200, json.dumps({"noticeTime": "2026-09-18T09:00:00Z"}))
    second = source.poll(NOW + 10)
    assert second is not None and second.kind == REBALANCE


def test_aws_interruption_outranks_rebalance(serve):
    fake = FakeAws()
    source = AwsSource(serve(fake), timeout_s=TIMEOUT_S)
    fake.rebalance = (200, json.dumps({"noticeTime": "2026-09-18T08:17:00Z"}))
    fake.instance_action = (200, json.dumps({"action": "stop", "time": "2026-09-18T08:22:00Z"}))
    assert source.poll(NOW).kind == PREEMPT


# --- GCP ---------------------------------------------------------------------------------


def test_gcp_server_requires_the_metadata_flavor_header(serve):
    import httpx

    url = serve(FakeGcp())
    assert httpx.get(url + "/computeMetadata/v1/instance/preempted").status_code == 403


def test_gcp_false_then_true_is_a_preempt_notice_30s_out(serve):
    fake = FakeGcp()
    source = GcpSource(serve(fake), timeout_s=TIMEOUT_S)
    assert source.poll(NOW) is None
    fake.preempted = "TRUE"
    notice = source.poll(NOW)
    assert notice is not None and (notice.source, notice.kind, notice.deadline) == ("gcp", PREEMPT, NOW + 30)
    assert all(r[2].get("metadata-flavor") == "Google" for r in fake.requests)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("NONE", None),
        ("MIGRATE_ON_HOST_MAINTENANCE", None),
        ("TERMINATE_ON_HOST_MAINTENANCE", (MAINTENANCE, NOW + 60)),
    ],
)
def test_gcp_maintenance_event(serve, value, expected):
    fake = FakeGcp()
    fake.maintenance = (200, value)
    notice = GcpSource(serve(fake), timeout_s=TIMEOUT_S).poll(NOW)
    assert (notice and (notice.kind, notice.deadline)) == (expected or None)


def test_gcp_maintenance_polling_can_be_switched_off(serve):
    fake = FakeGcp()
    fake.maintenance = (200, "TERMINATE_ON_HOST_MAINTENANCE")
    assert GcpSource(serve(fake), timeout_s=TIMEOUT_S, maintenance=False).poll(NOW) is None
    assert all("maintenance" not in r[1] for r in fake.requests)


# --- Azure -------------------------------------------------------------------------------

PREEMPT_EVENT = {
    "EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
    "EventType": "Preempt",
    "ResourceType": "VirtualMachine",
    "Resources": ["myspotvm"],
    "EventStatus": "Scheduled",
    "NotBefore": "Mon, 19 Sep 2026 18:29:47 GMT",
    "Description": "",
    "EventSource": "Platform",
    "DurationInSeconds": -1,
}


def test_azure_server_requires_the_metadata_header(serve):
    import httpx

    url = serve(FakeAzure())
    assert httpx.get(url + AzureSource.PATH).status_code == 400


def test_azure_preempt_event_is_a_notice_with_not_before_as_deadline(serve):
    fake = FakeAzure()
    source = AzureSource(serve(fake), timeout_s=TIMEOUT_S)
    assert source.poll(NOW) is None
    fake.add_event(**PREEMPT_EVENT)
    notice = source.poll(NOW)
    assert notice is not None and (notice.source, notice.kind) == ("azure", PREEMPT)
    assert notice.deadline == 1789842587.0  # 2026-09-19T18:29:47Z
    assert source.last_event_ids == [PREEMPT_EVENT["EventId"]]
    assert all(r[2].get("metadata") == "true" for r in fake.requests)


@pytest.mark.parametrize(
    "event_type, kind", [("Preempt", PREEMPT), ("Terminate", PREEMPT), ("Reboot", MAINTENANCE), ("Freeze", None)]
)
def test_azure_event_types(serve, event_type, kind):
    fake = FakeAzure()
    fake.add_event(**{**PREEMPT_EVENT, "EventType": event_type})
    notice = AzureSource(serve(fake), timeout_s=TIMEOUT_S).poll(NOW)
    assert (notice.kind if notice else None) == kind


def test_azure_started_event_without_not_before_is_due_now(serve):
    fake = FakeAzure()
    fake.add_event(**{**PREEMPT_EVENT, "EventStatus": "Started", "NotBefore": ""})
    assert AzureSource(serve(fake), timeout_s=TIMEOUT_S).poll(NOW).deadline == NOW


def test_azure_polling_never_acknowledges_but_acknowledge_posts_start_requests(serve):
    fake = FakeAzure()
    fake.add_event(**PREEMPT_EVENT)
    source = AzureSource(serve(fake), timeout_s=TIMEOUT_S)
    source.poll(NOW)
    assert fake.acknowledged == []
    assert source.acknowledge(source.last_event_ids) is True
    assert fake.acknowledged == [{"StartRequests": [{"EventId": PREEMPT_EVENT["EventId"]}]}]


# --- failures are never notices ----------------------------------------------------------


def _aws_500(fake: FakeAws) -> None:
    fake.instance_action = (500, "Internal Server Error")


def _aws_garbage(fake: FakeAws) -> None:
    fake.instance_action = (200, '{"action": "terminate", "time": ')


def _aws_wrong_shape(fake: FakeAws) -> None:
    fake.instance_action = (200, '["terminate"]')


def _slow(fake: Fake) -> None:
    fake.delay_s = TIMEOUT_S * 3


def _gcp_garbage(fake: FakeGcp) -> None:
    fake.preempted = "<html>proxy error</html>"


def _azure_garbage(fake: FakeAzure) -> None:
    fake.raw = (200, "{not json")


def _azure_500(fake: FakeAzure) -> None:
    fake.raw = (503, "Service Unavailable")


FAILURES = [
    ("aws 500", FakeAws, AwsSource, _aws_500),
    ("aws malformed json", FakeAws, AwsSource, _aws_garbage),
    ("aws json of the wrong shape", FakeAws, AwsSource, _aws_wrong_shape),
    ("aws slow", FakeAws, AwsSource, _slow),
    ("gcp garbage", FakeGcp, GcpSource, _gcp_garbage),
    ("gcp slow", FakeGcp, GcpSource, _slow),
    ("azure malformed json", FakeAzure, AzureSource, _azure_garbage),
    ("azure 503", FakeAzure, AzureSource, _azure_500),
    ("azure slow", FakeAzure, AzureSource, _slow),
]


@pytest.mark.parametrize("label, fake_cls, source_cls, break_it", FAILURES, ids=[f[0] for f in FAILURES])
def test_a_broken_answer_is_unavailable_and_never_a_notice(serve, caplog, label, fake_cls, source_cls, break_it):
    fake = fake_cls()
    break_it(fake)
    source = source_cls(serve(fake), timeout_s=TIMEOUT_S)
    with pytest.raises(SourceUnavailable):
        source.poll(NOW)
    watcher = NoticeWatcher([source])
    with caplog.at_level(logging.DEBUG, logger="orch.preemption"):
        assert watcher.poll_all(NOW) == []
    assert not watcher.notice_active
    assert any(r.levelno == logging.WARNING and source.name in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("source_cls", [AwsSource, GcpSource, AzureSource])
def test_an_unreachable_endpoint_is_never_a_notice(closed_port_url, source_cls):
    source = source_cls(closed_port_url, timeout_s=TIMEOUT_S)
    with pytest.raises(SourceUnavailable):
        source.poll(NOW)
    assert NoticeWatcher([source]).poll_all(NOW) == []


def test_a_slow_server_does_not_hold_the_poll_past_the_timeout(serve):
    fake = FakeGcp()
    fake.hold = threading.Event()  # the server answers only once the test lets it (or after 60 s)
    watcher = NoticeWatcher([GcpSource(serve(fake), timeout_s=0.2)])
    try:
        assert watcher.poll_all(NOW) == []
        # the poll gave up while the server still held its answer: it did not wait for it
        assert fake.requests and fake.answered == 0
    finally:
        fake.hold.set()


def test_the_proxy_environment_is_ignored_for_metadata(serve, monkeypatch):
    """Link-local metadata must not go through http_proxy (set on many Chinese GPU images)."""
    fake = FakeGcp()
    url = serve(fake)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    fake.preempted = "TRUE"
    assert GcpSource(url, timeout_s=TIMEOUT_S).poll(NOW).kind == PREEMPT
