"""What the controller knows, put into the policy's terms (policy.Situation): a job's work done and
left from its manifest, the market it runs on from its launch claims, whether spot can be had
from the market's latest answers, and the spot lifetimes seen across the controller's jobs.
Pure functions of what was read from the mirror; the controller calls them every pass."""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..cost.money import Pricing
from ..model.markets import IDLE, ON_DEMAND, SPOT
from ..objectstore import claims as cl
from .jobview import claim_instance
from .policy import Seen, Situation

DEFAULT_PRICE_RATIO = 3.0  # spot at about a third of on-demand (AWS GPU instances) when [pricing] does not say
MAX_LIFETIMES = 200  # the newest spot lifetimes kept across jobs (the policy looks at fewer)


def work_of(m: Mapping[str, Any]) -> Optional[tuple[float, float]]:
    """(seconds of work done, seconds left) at the pace the job has had so far, or None before a
    pace is measured (no step done yet)."""
    progress = m.get("progress") or {}
    step, total = progress.get("step"), progress.get("total_steps")
    run_s = float((m.get("cost") or {}).get("run_seconds") or 0.0)
    if not isinstance(step, int) or not isinstance(total, int) or step <= 0 or total <= 0 or run_s <= 0:
        return None
    pace = run_s / step
    return step * pace, max(0, total - step) * pace


def handover_s(m: Mapping[str, Any]) -> float:
    """The job's measured hand-over: on the machines it ran on (its manifest's `machines`), the
    time each spent without progress -- from its adoption to its last step, less the steps it made
    at the job's pace -- the median over those that made progress; 0 before any did."""
    progress = m.get("progress") or {}
    step = progress.get("step")
    run_s = float((m.get("cost") or {}).get("run_seconds") or 0.0)
    if not isinstance(step, int) or step <= 0 or run_s <= 0:
        return 0.0
    pace = run_s / step
    idle = []
    for rec in (m.get("machines") or [])[1:]:  # the first machine started the job: no hand-over
        first, last, since, until = (rec.get(k) for k in ("first_step", "last_step", "from", "to"))
        if not all(isinstance(v, (int, float)) for v in (first, last, since, until)) or last <= first:
            continue
        idle.append(max(0.0, (until - since) - (last - first) * pace))
    return statistics.median(idle) if idle else 0.0


def current_market(claims: list[cl.Claim], owner: Mapping[str, Any]) -> str:
    """The market of the machine holding the job's lease: the launch whose instance the lease
    names, else the newest launch that came up and was not a planned move's new machine still
    waiting to take over. "" (unknown) when the controller did not launch it (a job's first
    machine, started by hand): such a job is never moved. IDLE when no machine holds the lease."""
    if not owner.get("home_id") or owner.get("released"):
        return IDLE
    launched = [c for c in claims if c.status == cl.LAUNCHED]
    instance = owner.get("instance_id")
    for c in reversed(launched):
        if instance and claim_instance(c) == instance:
            return c.market
    for c in reversed(launched):
        if c.extra.get("move_for") != owner.get("home_id"):
            return c.market
    return ""


def spot_lifetimes(claims: list[cl.Claim]) -> list[tuple[float, float]]:
    """(when it ended, how long it lived) for each spot machine of this job that came up and was
    lost later: from its launch to the last heartbeat of the lease the next claim was made for.
    Planned moves (the job handed over) are not losses and are not counted."""
    out = []
    for i, c in enumerate(claims[:-1]):
        if c.status != cl.LAUNCHED or c.market != SPOT:
            continue
        nxt = claims[i + 1]
        hb = nxt.lost.get("heartbeat")
        if nxt.extra.get("move_for") or not isinstance(hb, (int, float)) or hb <= c.updated_at:
            continue
        out.append((float(hb), float(hb) - c.updated_at))
    return out


@dataclass
class MarketView:
    """The spot market as this controller has seen it: refusals and lifetimes, across jobs."""

    refused_at: Optional[float] = None  # the newest spot refusal for capacity
    refused_since: Optional[float] = None  # ... and since when spot has been refused without a launch between
    launched_at: Optional[float] = None  # the newest spot launch that came up
    # (uid, when it ended) -> how long it lived; may be shared by several controllers' views of
    # one market (the market benchmark's replays of one trace): seen() keeps what ended by then.
    lifetimes: dict[tuple[str, float], float] = field(default_factory=dict)
    # seen()'s sort of `lifetimes` by when each ended, kept until note_claims changes them (or
    # another view sharing the dict changed its size): a decision per job per pass reads it.
    _ordered: Optional[tuple[int, list[float], list[float]]] = field(default=None, repr=False)

    def note_claims(self, uid: str, claims: list[cl.Claim]) -> None:
        for ended, lived in spot_lifetimes(claims):
            if self.lifetimes.get((uid, ended)) != lived:
                self.lifetimes[(uid, ended)] = lived
                self._ordered = None
        if len(self.lifetimes) > 4 * MAX_LIFETIMES:
            for key in sorted(self.lifetimes, key=lambda k: k[1])[: len(self.lifetimes) - MAX_LIFETIMES]:
                del self.lifetimes[key]
            self._ordered = None
        for c in claims:
            if c.market != SPOT:
                continue
            if c.status == cl.NO_CAPACITY:
                since = float(c.extra.get("capacity_since") or c.updated_at)
                self.note_refused(c.updated_at, since)
            elif c.status == cl.LAUNCHED:
                self.note_launched(c.updated_at)

    def note_refused(self, at: float, since: float) -> None:
        if self.refused_at is None or at > self.refused_at:
            self.refused_at, self.refused_since = at, since

    def note_launched(self, at: float) -> None:
        if self.launched_at is None or at > self.launched_at:
            self.launched_at = at

    def spot_now(self, now: float, retry_s: float) -> bool:
        """Spot is believed available unless it was refused lately (within one retry) and not
        launched since: an older refusal is worth another try."""
        if self.refused_at is None or (self.launched_at is not None and self.launched_at >= self.refused_at):
            return True
        return now - self.refused_at >= retry_s

    def waiting_since(self) -> Optional[float]:
        if self.refused_at is None or (self.launched_at is not None and self.launched_at >= self.refused_at):
            return None
        return self.refused_since

    def seen(self, now: float) -> Seen:
        """The lifetimes of the spot machines that ended by `now`, oldest first (the newest
        MAX_LIFETIMES), and the last moment spot was seen unavailable: a refusal, or a spot
        machine's end (the cloud reclaimed it)."""
        if self._ordered is None or self._ordered[0] != len(self.lifetimes):
            ordered = sorted(self.lifetimes.items(), key=lambda kv: kv[0][1])
            self._ordered = (len(self.lifetimes), [k[1] for k, _ in ordered], [lived for _, lived in ordered])
        _, ends, lives = self._ordered
        upto = bisect.bisect_right(ends, now)
        down = [t for t in (self.refused_at, ends[upto - 1] if upto else None) if t is not None and t <= now]
        return Seen(lifetimes_s=tuple(lives[max(0, upto - MAX_LIFETIMES) : upto]), down_at=max(down) if down else None)


def price_ratio(pricing: Any, gpus: int) -> float:
    """On-demand price / spot price by [pricing]; DEFAULT_PRICE_RATIO when it does not say both."""
    prices = Pricing.of(pricing)
    spot = prices.machine_hour(gpus, SPOT)
    if prices.on_demand_gpu_hour is None or spot <= 0:
        return DEFAULT_PRICE_RATIO
    return max(prices.machine_hour(gpus, ON_DEMAND) / spot, 1.0)


def situation(
    m: Mapping[str, Any],
    *,
    now: float,
    started: float,
    deadline: Optional[float],
    current: str,
    losses: int,
    market: MarketView,
    rc: Any,
    pricing: Any,
    reaction_s: float,
    retry_s: float,
) -> Situation:
    """The policy's view of one job. Before its pace is measured (no step done yet) the work left
    is unknown and the job is placed as one without a deadline: spot first, on-demand after
    max_spot_wait_minutes without capacity."""
    work = work_of(m)
    if work is None:  # no slack can be known without a pace: placed as a job without a deadline
        work, deadline = (0.0, float("inf")), None
    return Situation(
        now=now,
        done_s=work[0],
        left_s=work[1],
        spot_now=market.spot_now(now, retry_s),
        current=current or IDLE,
        changeover_s=rc.changeover_minutes * 60,
        handover_s=handover_s(m),
        outage_s=rc.controller_outage_minutes * 60,
        price_ratio=price_ratio(pricing, int(m.get("gpus") or 0)),
        reaction_s=reaction_s,
        seen=market.seen(now),
        started=started,
        deadline=deadline,
        losses=losses,
        on_demand_after=rc.on_demand_after,
        max_spot_wait_s=rc.max_spot_wait_minutes * 60,
        spot_refused_since=market.waiting_since(),
    )


__all__ = [
    "MarketView",
    "current_market",
    "handover_s",
    "price_ratio",
    "situation",
    "spot_lifetimes",
    "work_of",
    "ON_DEMAND",
]
