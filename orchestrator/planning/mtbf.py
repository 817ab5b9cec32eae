"""This machine's mean time between failures, the M of `[checkpoint] every = "auto"` (Young/Daly):
the daemon's uptime over the machine events it has seen. One count for the daemon (ORCH_MTBF_S for
the jobs it starts) and `orch estimate`; contract.mtbf_choice says which MTBF a job uses."""

from __future__ import annotations

from typing import Optional, Sequence

from ..model.states import STOPPING_KINDS, notice_kind


def machine_events(notice_details: Sequence[str], lost_at: Sequence[float]) -> int:
    """Machine events: a notice counts only when it stops jobs (an AWS rebalance warning stops
    nothing), and a machine loss counts once, however many attempts it lost (they are settled by
    one tick, at one time)."""
    stopping = sum(1 for detail in notice_details if notice_kind(detail) in STOPPING_KINDS)
    losses = len({round(t, 3) for t in lost_at})
    return stopping + losses


def machine_mtbf(
    notice_details: Sequence[str], lost_at: Sequence[float], uptime_s: float
) -> Optional[tuple[float, int]]:
    """(seconds, machine events), or None before the first one (then orch assumes its default)."""
    events = machine_events(notice_details, lost_at)
    if not events or uptime_s <= 0:
        return None
    return uptime_s / events, events
