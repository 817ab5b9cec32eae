"""The market policy: for one unfinished job, now, idle (wait for spot, free), spot or on-demand,
with a one-line reason and the moment the answer would change if nothing else did.

One pure function, `decide`, fed by the controller every pass and by the market benchmark.
With a deadline its floor is Uniform Progress ("Can't Be Late", Wu et al., NSDI'24, section 4):
take spot whenever it can be had; when it cannot and the job is behind the uniform line
t * C / R, run on-demand; leave on-demand (for spot) only when ahead of the line at t + 2d; and a
safety net, on-demand for good once the time left is under the work left + 2d (+ the controller's
reaction time: a lost machine is noticed after stale_after and a poll).
Beyond that floor it uses what the controller has observed of this spot market (`Seen`), never a
trace: when the spot machines seen here did, on average, more work than a move to them costs
(`_spot_pays`), a job on on-demand takes spot as soon as it can be had, even behind the line
(the paper's "taking risks" rule, gated by evidence). With fewer than MIN_EVIDENCE observations
it is Uniform Progress. Without a deadline: spot first; on-demand after `max_spot_wait_s`
without capacity or after `on_demand_after` lost machines (unless the same evidence says spot
pays); back to spot when it can be had."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

from ..model.markets import IDLE, ON_DEMAND, SPOT

MIN_EVIDENCE = 3  # spot lifetimes observed before they are believed (one is luck)
WINDOW = 20  # the newest observations that count: a market changes over days


@dataclass(frozen=True)
class Seen:
    """What the controller has observed of this spot market, across its jobs, newest last."""

    lifetimes_s: tuple[float, ...] = ()  # spot machines: from launch until the cloud reclaimed them


@dataclass(frozen=True)
class Situation:
    now: float
    done_s: float  # work done (seconds of training at the job's pace)
    left_s: float  # work left
    spot_now: bool  # spot can be had now, as far as the controller knows
    current: str  # SPOT, ON_DEMAND or IDLE: what the job runs on now
    changeover_s: float  # d: a new machine's boot, adopt and resume; paid, no progress
    price_ratio: float  # on-demand price / spot price
    reaction_s: float = 0.0  # how long a lost machine goes unnoticed (stale_after + a poll)
    seen: Seen = Seen()
    started: float = 0.0  # when the job came to the controller: the uniform line starts here
    deadline: Optional[float] = None
    # Without a deadline:
    losses: int = 0  # machines this job has lost
    on_demand_after: int = 3
    max_spot_wait_s: float = 3600.0
    spot_refused_since: Optional[float] = None  # spot refused for capacity, continuously, since


@dataclass(frozen=True)
class Decision:
    market: str  # SPOT, ON_DEMAND or IDLE
    why: str
    review_at: Optional[float] = None  # when this answer changes if nothing else does


def break_even_lifetime_s(changeover_s: float, price_ratio: float) -> float:
    """How long a spot machine must live for a move from on-demand to pay: the move costs one
    changeover on spot (d / k in on-demand hours) and, once the machine is reclaimed, one back
    on on-demand (d); each hour on spot saves 1 - 1/k. So L = d (k + 1) / (k - 1)."""
    k = max(price_ratio, 1.0 + 1e-9)
    return changeover_s * (k + 1) / (k - 1)


def decide(s: Situation) -> Decision:
    if s.left_s <= 0:
        return Decision(IDLE, "no work left")
    if s.deadline is None:
        return _without_deadline(s)
    return _with_deadline(s, s.deadline)


def _with_deadline(s: Situation, deadline: float) -> Decision:
    d = s.changeover_s
    time_left = deadline - s.now
    # The safety net's moment: from then on, one lost machine (noticed after reaction_s, replaced
    # after a changeover) would make the job late.
    net_at = deadline - s.left_s - 2 * d - s.reaction_s
    if s.now >= net_at:
        return Decision(
            ON_DEMAND,
            f"safety net: {_h(time_left)} to the deadline for {_h(s.left_s)} of work, 2 changeovers and a "
            "loss's detection: on-demand to the end",
        )
    total, span = s.done_s + s.left_s, max(deadline - s.started, 1.0)

    def line(t: float) -> float:  # the uniform line: work that should be done by t
        return total * (t - s.started) / span

    risky = _spot_pays(s)
    if s.spot_now:
        if s.current != ON_DEMAND:
            return Decision(SPOT, "spot can be had")
        if s.done_s >= line(s.now + 2 * d):
            return Decision(SPOT, "spot can be had and the job is ahead of the uniform line at now + 2d")
        if risky:
            return Decision(SPOT, f"spot can be had and the spot machines here did {risky}")
        return Decision(
            ON_DEMAND,
            "spot can be had, but the job is behind the uniform line at now + 2d: stays on on-demand",
            review_at=min(_catch_up_at(s, line, 2 * d), net_at),
        )
    if s.current == ON_DEMAND:
        # Uniform Progress leaves on-demand only for spot: going idle and coming back would pay a
        # second changeover for an outage of unknown length.
        return Decision(ON_DEMAND, "no spot to go to: stays on on-demand", review_at=net_at)
    if s.done_s < line(s.now):
        return Decision(ON_DEMAND, "no spot and the job is behind the uniform line")
    behind_at = s.started + span * s.done_s / total  # the line reaches the work done
    return Decision(IDLE, "no spot; ahead of the uniform line: waits for spot, free", review_at=min(behind_at, net_at))


def _catch_up_at(s: Situation, line: object, margin: float) -> float:
    """When a job progressing at full speed from now is ahead of line(t + margin)."""
    assert s.deadline is not None
    rate = (s.done_s + s.left_s) / max(s.deadline - s.started, 1.0)  # the line's slope, < 1
    if rate >= 1.0:
        return float("inf")
    gap = rate * (s.now + margin - s.started) - s.done_s
    return s.now + max(gap, 0.0) / (1.0 - rate)


def _without_deadline(s: Situation) -> Decision:
    risky = _spot_pays(s)
    lost_too_many = s.losses >= s.on_demand_after
    if lost_too_many and not risky:
        return Decision(ON_DEMAND, f"{s.losses} machine(s) of this job lost (on_demand_after = {s.on_demand_after})")
    since = s.now if s.spot_refused_since is None else s.spot_refused_since
    give_up_at = since + s.max_spot_wait_s
    if s.current != ON_DEMAND and s.spot_refused_since is not None and s.now >= give_up_at:
        # Refused that long: on-demand, even if the next try might have had spot.
        return Decision(ON_DEMAND, f"no spot capacity for {_h(s.now - since)} (max_spot_wait_minutes)")
    if s.spot_now:
        if s.current == ON_DEMAND and lost_too_many:
            return Decision(SPOT, f"spot can be had again and the spot machines here did {risky}")
        return Decision(SPOT, "spot can be had" + (" again" if s.current == ON_DEMAND else ""))
    if s.current == ON_DEMAND:
        return Decision(ON_DEMAND, "no spot to go back to")
    return Decision(IDLE, f"no spot capacity; waits until {_h(s.max_spot_wait_s)} without it", review_at=give_up_at)


def _spot_pays(s: Situation) -> str:
    """Non-empty (the reason) when, over the spot lifetimes observed here, a move from on-demand
    to spot is expected to pay: per move, the work a spot machine does (its life less one
    changeover) saves that much on-demand time, against its spot bill (life / k) and one
    changeover back on on-demand when it is reclaimed. In on-demand hours."""
    recent = s.seen.lifetimes_s[-WINDOW:]
    if len(recent) < MIN_EVIDENCE:
        return ""
    d, k = s.changeover_s, max(s.price_ratio, 1.0)
    work = statistics.fmean(max(life - d, 0.0) for life in recent)
    bill = statistics.fmean(recent) / k + d
    if work <= bill:
        return ""
    return f"{_h(work)} of work per machine against {_h(bill)} of on-demand cost (last {len(recent)} observed)"


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.0f} min"
