"""`--at` values: ISO-8601 (local time unless an offset is given) or a delay like +30m / +2h."""

from __future__ import annotations

import re
from datetime import datetime

from ..model.errors import UsageError

_DELAY = re.compile(r"^\+(\d+(?:\.\d+)?)\s*([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_at(text: str, now: float) -> float:
    """Unix seconds for an --at value."""
    value = text.strip()
    m = _DELAY.match(value)
    if m:
        return now + float(m.group(1)) * _UNIT[m.group(2)]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"--at: cannot read {text!r}: give a time like 2026-12-01T02:00 (local), "
            "2026-12-01T02:00+08:00, or a delay like +30m, +2h, +1d"
        ) from None
    # A naive time is the user's local time; .timestamp() interprets it so.
    return moment.timestamp()
