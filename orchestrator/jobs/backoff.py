"""The one backoff rule: base × 2^tries, capped. Retries of a failed job, of a notification and of
an upload all wait this way."""

from __future__ import annotations

from ..spec.config import Config


def backoff_s(tries: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait before the next try after `tries` failed ones (0: wait `base_s`)."""
    return min(cap_s, base_s * 2 ** min(max(tries, 0), 32))


def retry_backoff_s(config: Config, tries: int) -> float:
    """How long a failing job waits before its next attempt, after `tries` charged ones."""
    return backoff_s(tries, config.daemon.retry_backoff_seconds, config.daemon.max_retry_backoff_seconds)
