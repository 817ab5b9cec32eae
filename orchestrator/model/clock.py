"""How a moment is shown to people: one clock format everywhere (deadlines, projected finishes,
`--at` holds, estimates), with its year and zone so a log read a week later is unambiguous."""

from __future__ import annotations

import math
import time


def format_clock(ts: float | None) -> str:
    """A moment (a deadline, a projected finish) with its year and zone: '2026-12-05 18:00 CST'."""
    if ts is None:
        return "unknown"
    if math.isinf(ts):
        return "never"
    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(ts))
