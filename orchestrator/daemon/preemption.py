"""Preemption notice sources: AWS IMDSv2, GCP metadata, Azure Scheduled Events and a sentinel
file. (SIGTERM to the daemon itself is handled by daemon_loop; notice_watch.py polls these.)

A source answers "is this machine about to go away?" with a Notice or None. When it cannot tell
(metadata server unreachable, slow, 5xx, garbage) it raises SourceUnavailable: "I don't know" is
never a notice, so a flaky metadata server cannot stop a healthy queue.
"""

from __future__ import annotations

import email.utils
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import httpx

from ..model.errors import ConfigError, OrchError

from ..model.states import MAINTENANCE, PREEMPT, REBALANCE, STOPPING_KINDS  # noqa: F401  (the sources' words)

AWS_ENDPOINT = "http://169.254.169.254"
GCP_ENDPOINT = "http://metadata.google.internal"
AZURE_ENDPOINT = "http://169.254.169.254"
SOURCE_NAMES = ("aws", "gcp", "azure", "file")

# GCP gives Spot VMs 30 s between the notice (ACPI soft off) and the hard stop, and changes
# maintenance-event 60 s before host maintenance. Neither says when, so the deadline is now + these.
GCP_PREEMPT_LEAD_S = 30.0
GCP_MAINTENANCE_LEAD_S = 60.0


@dataclass(frozen=True)
class Notice:
    """One provider's statement that the machine will stop. `deadline`: Unix seconds, if known."""

    source: str
    kind: str
    deadline: float | None
    detail: str

    @property
    def stops_jobs(self) -> bool:
        return self.kind in STOPPING_KINDS


class SourceUnavailable(OrchError):
    """A source could not tell whether a notice exists. The watcher logs it; it is never a notice."""


class NoticeSource(Protocol):
    name: str

    def poll(self, now: float) -> Notice | None: ...


def parse_iso_utc(text: str) -> float:
    """'2026-09-18T08:22:00Z' -> Unix seconds. Python 3.10's fromisoformat rejects the 'Z'."""
    when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def parse_rfc1123(text: str) -> float:
    """Azure's NotBefore, 'Mon, 19 Sep 2016 18:29:47 GMT' -> Unix seconds."""
    return email.utils.parsedate_to_datetime(text).timestamp()


class _HttpSource:
    """Shared HTTP plumbing: one client, full URLs from the endpoint, every failure -> SourceUnavailable.

    trust_env=False because metadata servers are link-local: an http_proxy in the daemon's
    environment (common on Chinese GPU clouds) would send the request to the proxy instead.
    """

    name = "http"

    def __init__(self, endpoint: str, timeout_s: float, client: httpx.Client | None):
        self.endpoint = endpoint.rstrip("/")
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout_s, trust_env=False)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.request(method, self.endpoint + path, **kwargs)
        except httpx.HTTPError as exc:
            raise SourceUnavailable(f"{self.name}: {method} {path}: {type(exc).__name__}: {exc}") from exc

    def _unexpected(self, resp: httpx.Response) -> SourceUnavailable:
        body = resp.text[:200].replace("\n", " ")
        return SourceUnavailable(f"{self.name}: {resp.request.url.path} answered HTTP {resp.status_code}: {body}")

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


class AwsSource(_HttpSource):
    """EC2 Spot interruption (`spot/instance-action`, ~2 min notice) and rebalance recommendations.

    IMDSv2 only: a session token from PUT /latest/api/token, cached until shortly before its TTL
    ends and fetched again whenever a GET answers 401 (token expired or the IMDS restarted).
    """

    name = "aws"
    TOKEN_TTL_S = 21600  # the maximum IMDS allows
    TOKEN_REFRESH_MARGIN_S = 60.0

    def __init__(self, endpoint: str = AWS_ENDPOINT, timeout_s: float = 1.0, client: httpx.Client | None = None):
        super().__init__(endpoint, timeout_s, client)
        self._token: str | None = None
        self._token_expires = 0.0
        self._seen_rebalance: str | None = None

    def poll(self, now: float) -> Notice | None:
        resp = self._get("/latest/meta-data/spot/instance-action", now)
        if resp.status_code == 200:
            return self._instance_action(resp)
        if resp.status_code != 404:
            raise self._unexpected(resp)
        return self._rebalance(now)

    def instance_id(self, now: float) -> str | None:
        """This instance's id (i-0123456789abcdef0), None where the metadata server has none.
        The mirror's lease records it, so `orch watch` can ask EC2 whether the machine is gone."""
        resp = self._get("/latest/meta-data/instance-id", now)
        if resp.status_code == 404:
            return None
        value = resp.text.strip()
        if resp.status_code != 200 or not re.fullmatch(r"i-[0-9a-f]{8,17}", value):
            raise self._unexpected(resp)
        return value

    def _instance_action(self, resp: httpx.Response) -> Notice:
        try:
            body = resp.json()
            action, when = str(body["action"]), parse_iso_utc(body["time"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SourceUnavailable(f"aws: unreadable spot/instance-action {resp.text[:200]!r}: {exc}") from exc
        detail = f"AWS spot interruption: {action} at {body['time']}"
        return Notice(self.name, PREEMPT, when, detail)

    def _rebalance(self, now: float) -> Notice | None:
        """A rebalance recommendation stays up until the instance ends; report each noticeTime once."""
        resp = self._get("/latest/meta-data/events/recommendations/rebalance", now)
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._unexpected(resp)
        try:
            notice_time = str(resp.json()["noticeTime"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceUnavailable(f"aws: unreadable rebalance recommendation {resp.text[:200]!r}") from exc
        if notice_time == self._seen_rebalance:
            return None
        self._seen_rebalance = notice_time
        return Notice(self.name, REBALANCE, None, f"AWS rebalance recommendation at {notice_time}")

    def _get(self, path: str, now: float) -> httpx.Response:
        resp = self._request("GET", path, headers={"X-aws-ec2-metadata-token": self._session_token(now)})
        if resp.status_code == 401:
            self._token = None
            resp = self._request("GET", path, headers={"X-aws-ec2-metadata-token": self._session_token(now)})
        return resp

    def _session_token(self, now: float) -> str:
        if self._token is not None and now < self._token_expires - self.TOKEN_REFRESH_MARGIN_S:
            return self._token
        resp = self._request(
            "PUT", "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)}
        )
        if resp.status_code != 200 or not resp.text.strip():
            raise self._unexpected(resp)
        self._token, self._token_expires = resp.text.strip(), now + self.TOKEN_TTL_S
        return self._token


class GcpSource(_HttpSource):
    """Compute Engine `instance/preempted` (TRUE/FALSE) and, with `maintenance`, `maintenance-event`.

    GPU VMs cannot live-migrate, so TERMINATE_ON_HOST_MAINTENANCE ends them 60 s later; and GCP only
    warns about maintenance if the key was read since the last event, which polling it guarantees.
    """

    name = "gcp"
    HEADERS = {"Metadata-Flavor": "Google"}

    def __init__(
        self,
        endpoint: str = GCP_ENDPOINT,
        timeout_s: float = 1.0,
        client: httpx.Client | None = None,
        maintenance: bool = True,
    ):
        super().__init__(endpoint, timeout_s, client)
        self.maintenance = maintenance

    def poll(self, now: float) -> Notice | None:
        value = self._value("/computeMetadata/v1/instance/preempted")
        if value == "TRUE":
            return Notice(self.name, PREEMPT, now + GCP_PREEMPT_LEAD_S, "GCP preempted this VM (about 30 s left)")
        if value != "FALSE":
            raise SourceUnavailable(f"gcp: instance/preempted answered {value[:200]!r}, expected TRUE or FALSE")
        return self._maintenance(now) if self.maintenance else None

    def _maintenance(self, now: float) -> Notice | None:
        resp = self._request("GET", "/computeMetadata/v1/instance/maintenance-event", headers=self.HEADERS)
        if resp.status_code == 404:  # populated only for VMs that migrate or have a GPU
            return None
        if resp.status_code != 200:
            raise self._unexpected(resp)
        if resp.text.strip().upper() == "TERMINATE_ON_HOST_MAINTENANCE":
            detail = "GCP host maintenance will terminate this VM (about 60 s left)"
            return Notice(self.name, MAINTENANCE, now + GCP_MAINTENANCE_LEAD_S, detail)
        return None  # NONE, or MIGRATE_ON_HOST_MAINTENANCE: processes survive a live migration

    def _value(self, path: str) -> str:
        resp = self._request("GET", path, headers=self.HEADERS)
        if resp.status_code != 200:
            raise self._unexpected(resp)
        return resp.text.strip().upper()


class AzureSource(_HttpSource):
    """Azure Scheduled Events: Preempt (Spot eviction, >= 30 s) and the events that end the VM.

    Polling never acknowledges: a StartRequests POST lets the event proceed early for every VM in
    its Resources, i.e. it would shorten the time our jobs have to checkpoint. `acknowledge` exists
    for a caller that has already made every checkpoint durable. The service starts on the first
    request and may be slow for the first minutes; those polls fail quietly as "unavailable".
    """

    name = "azure"
    PATH = "/metadata/scheduledevents?api-version=2020-07-01"
    HEADERS = {"Metadata": "true"}
    # Freeze pauses the VM for seconds and processes survive it, so it is not a notice.
    KINDS = {"Preempt": PREEMPT, "Terminate": PREEMPT, "Reboot": MAINTENANCE, "Redeploy": MAINTENANCE}

    def __init__(self, endpoint: str = AZURE_ENDPOINT, timeout_s: float = 1.0, client: httpx.Client | None = None):
        super().__init__(endpoint, timeout_s, client)
        self.last_event_ids: list[str] = []

    def poll(self, now: float) -> Notice | None:
        events = self._events()
        notices = [n for n in (self._notice(e, now) for e in events) if n is not None]
        self.last_event_ids = [str(e.get("EventId", "")) for e in events if e.get("EventType") in self.KINDS]
        # Preempt outranks maintenance; among equals the earliest deadline is the one that matters.
        notices.sort(key=lambda n: (n.kind != PREEMPT, n.deadline if n.deadline is not None else float("inf")))
        return notices[0] if notices else None

    def acknowledge(self, event_ids: Sequence[str]) -> bool:
        """Approve events so they start now (only after checkpoints are safe). True on HTTP 200."""
        body = {"StartRequests": [{"EventId": event_id} for event_id in event_ids]}
        try:
            resp = self._request("POST", self.PATH, headers=self.HEADERS, json=body)
        except SourceUnavailable:
            return False
        return resp.status_code == 200

    def _events(self) -> list[dict[str, Any]]:
        resp = self._request("GET", self.PATH, headers=self.HEADERS)
        if resp.status_code != 200:
            raise self._unexpected(resp)
        try:
            events = resp.json()["Events"]
            if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
                raise TypeError("Events is not a list of objects")
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceUnavailable(f"azure: unreadable scheduled events {resp.text[:200]!r}: {exc}") from exc
        return events

    def _notice(self, event: dict[str, Any], now: float) -> Notice | None:
        kind = self.KINDS.get(str(event.get("EventType")))
        if kind is None:
            return None
        not_before = str(event.get("NotBefore") or "")
        try:
            deadline: float | None = parse_rfc1123(not_before) if not_before else None
        except (TypeError, ValueError):
            deadline = None
        if deadline is None and event.get("EventStatus") == "Started":
            deadline = now
        detail = f"Azure scheduled event {event.get('EventType')} {event.get('EventId', '?')}"
        return Notice(self.name, kind, deadline, detail + (f" not before {not_before}" if not_before else ""))


class FileSource:
    """A sentinel file: its existence is a preemption notice. For tests, and for providers without
    an API (a cron job or a provider hook can touch it). A number inside is seconds to the deadline."""

    name = "file"

    def __init__(self, path: Path):
        self.path = Path(path)

    def poll(self, now: float) -> Notice | None:
        if not self.path.exists():
            return None
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = ""
        try:
            deadline: float | None = now + float(text) if text else None
        except ValueError:
            deadline = None
        return Notice(self.name, PREEMPT, deadline, f"notice file {self.path} exists")


def build_sources(
    names: Sequence[str],
    *,
    aws_endpoint: str = AWS_ENDPOINT,
    gcp_endpoint: str = GCP_ENDPOINT,
    azure_endpoint: str = AZURE_ENDPOINT,
    file_path: Path | None = None,
    timeout_s: float = 1.0,
) -> list[NoticeSource]:
    """config.toml [preemption] sources -> source objects (file_path already resolved against $ORCH_HOME)."""
    unknown = [n for n in names if n not in SOURCE_NAMES]
    if unknown:
        raise ConfigError([f"[preemption] sources: unknown {unknown}; choose from {list(SOURCE_NAMES)}"])
    if "file" in names and file_path is None:
        raise ConfigError(['[preemption] sources has "file" but no file path is set'])
    makers: dict[str, Callable[[], NoticeSource]] = {
        "aws": lambda: AwsSource(aws_endpoint, timeout_s),
        "gcp": lambda: GcpSource(gcp_endpoint, timeout_s),
        "azure": lambda: AzureSource(azure_endpoint, timeout_s),
        "file": lambda: FileSource(file_path),  # type: ignore[arg-type]
    }
    return [makers[name]() for name in dict.fromkeys(names)]
