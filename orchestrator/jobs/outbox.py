"""Delivering the notification outbox, off the dispatch path: each due row goes to its channel
in id order, at most one message per channel's `min_interval_s`, with capped exponential
backoff on retryable errors and a recorded `notify_failed` event when a row is given up.
At-least-once: a row is marked delivered right after the provider accepts it, so a crash in
between resends it, and a row once accepted is never sent again."""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, Optional

from notifiers import Message, Notifier, NotifyError

from .backoff import backoff_s
from ..contract import METRICS_CSV
from ..redaction import redact
from ..cost.money import format_duration
from ..reports.metrics import read_metrics
from ..home.paths import Home

log = logging.getLogger("orch.outbox")

# How many pending rows one pass reads. Rows of a channel that must wait are skipped, not
# refetched, so this bounds how far one busy channel can push the others back.
_BATCH = 500

# The messages that end a job carry its loss curve where the channel can show a picture.
_CURVE_EVENTS = frozenset({"succeeded", "failed", "stopped", "diverged"})


class OutboxSender:
    """Remembers when each channel last sent, so spacing survives between passes."""

    def __init__(
        self,
        store: Any,
        notifiers: Mapping[str, Notifier],
        *,
        max_age_s: float = 86400,
        base_backoff_s: float = 5,
        max_backoff_s: float = 600,
        last_send: MutableMapping[str, float] | None = None,
        runs_dir: Optional[Path] = None,
    ):
        self.store = store
        self.passes = 0  # deliveries done: a test waits on them before it asserts nothing more was sent
        # Where the jobs' run folders are (default: beside the store's database, as Home lays it out).
        db = getattr(store, "path", None)
        self.runs_dir = runs_dir or (Home(Path(db).parent).runs if db else None)
        self.notifiers = notifiers
        self.max_age_s = max_age_s
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.last_send: MutableMapping[str, float] = {} if last_send is None else last_send

    @classmethod
    def from_config(cls, store: Any, config: Any) -> "OutboxSender":
        """The daemon's and `orch watch`'s sender: config.toml's channels and [notify] retries."""
        from .notify import build_channels

        return cls(
            store,
            {n.name: n for n in build_channels(config)},
            max_age_s=config.notify.give_up_after_hours * 3600,
            base_backoff_s=config.notify.retry_base_seconds,
            max_backoff_s=config.notify.retry_max_seconds,
        )

    def deliver_due(self, now: float) -> int:
        """Send every row that is due and allowed now; return how many the providers accepted."""
        delivered = 0
        for channel in self.store.pending_channels():
            delivered += self._deliver_channel(channel, now)
        self.passes += 1
        return delivered

    def _deliver_channel(self, channel: str, now: float) -> int:
        """A channel's rows in order until one fails or must wait: messages about one job must
        not arrive out of order ("succeeded" before "started"), so a row still backing off from
        an earlier pass holds the rows behind it. Read per channel, so a channel that is down
        with a long backlog never delays the others."""
        delivered = 0
        notifier = self.notifiers.get(channel)
        for row in self.store.pending_outbox_for(channel, limit=_BATCH):
            if notifier is None:
                self._give_up(row, now, f"channel '{channel}' is no longer configured in [[notifiers]]")
                continue
            if row.next_try_at > now:
                break
            last = self.last_send.get(channel)
            if last is not None and now - last < notifier.min_interval_s:
                break
            try:
                message = Message.from_dict(row.payload)
            except (TypeError, ValueError) as exc:
                self._give_up(row, now, f"unreadable message in the outbox: {exc}")
                continue
            self._attach_curve(message)
            self.last_send[channel] = now
            try:
                notifier.send(message)
            except NotifyError as exc:
                self._failed(row, now, exc)
                break
            except Exception as exc:  # a bug in one channel must never stop the daemon
                log.exception("notifier %s crashed on outbox row %d", channel, row.id)
                self._failed(row, now, NotifyError(channel, f"{type(exc).__name__}: {exc}", retryable=True))
                break
            self.store.mark_delivered(row.id, now)
            delivered += 1
        return delivered

    def _attach_curve(self, message: Message) -> None:
        if message.event in _CURVE_EVENTS and message.job_id is not None and self.runs_dir is not None:
            message.curve_series = read_metrics(self.runs_dir / str(message.job_id) / METRICS_CSV)["series"]

    def backoff_s(self, tries: int) -> float:
        """Delay after the (tries + 1)-th failed try: base, 2×base, 4×base, ... capped."""
        return backoff_s(tries, self.base_backoff_s, self.max_backoff_s)

    def _failed(self, row: Any, now: float, exc: NotifyError) -> None:
        # The store prefixes the channel name; summary is the provider's words and code.
        error = redact(exc.summary)
        if not exc.retryable:
            self._give_up(row, now, f"{error} (permanent: fix the notifier's config, then `orch notify test`)")
            return
        delay = self.backoff_s(row.tries)
        if exc.retry_after is not None:
            delay = max(delay, exc.retry_after)  # the provider knows better than our schedule
        next_try_at = now + delay
        if next_try_at - row.created_at > self.max_age_s:
            self._give_up(row, now, f"still failing after {format_duration(now - row.created_at)}: {error}")
            return
        log.info("notification %d via %s failed, retrying in %.0f s: %s", row.id, row.channel, delay, error)
        self.store.mark_retry(row.id, now, next_try_at, error)

    def _give_up(self, row: Any, now: float, error: str) -> None:
        error = redact(error)
        job = f"job {row.job_id}" if row.job_id is not None else "no job"
        log.warning("notification %d (%s) via %s given up: %s", row.id, job, row.channel, error)
        # The store also records a notify_failed event, so `orch show` tells the user.
        self.store.mark_gave_up(row.id, now, error)
