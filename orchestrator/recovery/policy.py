"""The market policy: for one unfinished job, now, idle (wait for spot, free), spot or on-demand,
with a one-line reason and the moment the answer would change if nothing else did.

One pure function, `decide`, fed by the controller every pass and by the market benchmark.
With a deadline its floor is Uniform Progress ("Can't Be Late", Wu et al., NSDI'24, section 4):
take spot whenever it can be had; when it cannot and the job is behind the uniform line
t * C / R, run on-demand; leave on-demand (for spot) only when ahead of the line at t + 2d; and a
safety net, on-demand for good once the time left is under the work left + 2d (+ the controller's
reaction time: a lost machine is noticed after stale_after and a poll; + the time the controller
itself may be away, [recovery] controller_outage_minutes).

d is what a new machine costs the job before it makes progress: its boot (changeover_s) and the
job's hand-over (handover_s: the checkpoint's download and the resume up to the first step, as
measured on this job's own machines; 0 until measured). Every move pays it.

Beyond that floor, each spot offer gets a predicted lifetime (`predicted_lifetime_s`): from the
lifetimes of the spot machines seen on this market (one zone and instance type, never mixed),
those that outlived the offer's age (how long spot has been up here since it was last seen
down), the median of what they lived on. With it (the paper's section 5.4):
- from idle, spot is skipped (treated as not there) when the predicted lifetime is under
  k d / (k - 1): such a machine costs more (life / k) than the on-demand time its work (life - d)
  would replace;
- from on-demand, spot is taken only when the predicted lifetime is above 2 k d / (k - 1) (the
  move pays d on spot and, when spot is reclaimed, d again on on-demand) -- then even behind the
  uniform line ("taking risks", gated by evidence).
With fewer than MIN_EVIDENCE lifetimes seen it is Uniform Progress.

A spot zone outside the bucket's region (zones.py) pays the checkpoint's transfer on top of d: its
time without progress (transfer_s) and its egress, counted as the on-demand time it would buy
(transfer_cost_s). Both thresholds then use d + transfer (k (d + T) / (k - 1) from idle, k (2d + T) /
(k - 1) from on-demand), and with no lifetime evidence the job's work left stands in for the
prediction (the most such a move can save): a far zone is taken only when its saving outweighs
the transfer. Zones of the bucket's region move for free.

A deadline the job cannot meet even on on-demand from now (work left, + d when no machine holds
it) is said at once: `Decision.infeasible_at` is the earliest finish orch can promise; the job
stays on the machine it has (a move would only add d), else goes on-demand.

Without a deadline: spot first; on-demand after `max_spot_wait_s` without capacity or after
`on_demand_after` lost machines (unless the prediction says a move to spot pays); back to spot
when it can be had."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Optional

from ..model.markets import IDLE, ON_DEMAND, SPOT

MIN_EVIDENCE = 3  # spot lifetimes observed before they are believed (one is luck)
WINDOW = 20  # the newest observations that count: a market changes over days


@dataclass(frozen=True)
class Seen:
    """What the controller has observed of one spot market (a zone and an instance type)."""

    lifetimes_s: tuple[float, ...] = ()  # spot machines, newest last: from launch until reclaimed
    down_at: Optional[float] = None  # the last moment spot was seen unavailable (a refusal, a reclaim)


@dataclass(frozen=True)
class Situation:
    now: float
    done_s: float  # work done (seconds of training at the job's pace)
    left_s: float  # work left
    spot_now: bool  # spot can be had now, as far as the controller knows
    current: str  # SPOT, ON_DEMAND or IDLE: what the job runs on now
    changeover_s: float  # a new machine's boot, install and adopt; paid, no progress
    price_ratio: float  # on-demand price / spot price
    reaction_s: float = 0.0  # how long a lost machine goes unnoticed (stale_after + a poll)
    seen: Seen = Seen()
    started: float = 0.0  # when the job came to the controller: the uniform line starts here
    deadline: Optional[float] = None
    handover_s: float = 0.0  # the job's measured resume after an adoption (0 until measured)
    outage_s: float = 0.0  # how long the controller itself may be away ([recovery] controller_outage_minutes)
    # The spot zone judged here lies outside the bucket's region: its launch pays the checkpoint's
    # transfer -- its time (no progress, billed) and its egress as seconds of on-demand it would buy.
    transfer_s: float = 0.0
    transfer_cost_s: float = 0.0
    # Without a deadline:
    losses: int = 0  # machines this job has lost
    on_demand_after: int = 3
    max_spot_wait_s: float = 3600.0
    spot_refused_since: Optional[float] = None  # spot refused for capacity, continuously, since

    @property
    def move_s(self) -> float:
        """d: what one new machine costs the job before it makes progress."""
        return self.changeover_s + self.handover_s

    @property
    def spot_move_s(self) -> float:
        """What a launch on the spot judged here costs before it pays: d, plus a cross-region
        transfer's time and egress."""
        return self.move_s + self.transfer_s + self.transfer_cost_s

    @property
    def crossing(self) -> bool:
        return self.transfer_s + self.transfer_cost_s > 0


@dataclass(frozen=True)
class Decision:
    market: str  # SPOT, ON_DEMAND or IDLE
    why: str
    review_at: Optional[float] = None  # when this answer changes if nothing else does
    infeasible_at: Optional[float] = None  # the deadline cannot be met: the earliest finish, on on-demand
    zone: str = ""  # with [[recovery.zones]]: where a launch on `market` goes (zones.py chooses it)


def predicted_lifetime_s(seen: Seen, now: float) -> Optional[float]:
    """How long a spot machine launched now is expected to live: of the recent lifetimes that
    outlived the offer's age (spot up since seen.down_at), the median of what they lived beyond
    it. None with fewer than MIN_EVIDENCE lifetimes. An offer older than all but a few of them
    is expected to live at least as long again as it has (the longer spot has lasted, the longer
    it lasts: the traces' spells are heavy-tailed)."""
    recent = seen.lifetimes_s[-WINDOW:]
    if len(recent) < MIN_EVIDENCE:
        return None
    age = max(0.0, now - seen.down_at) if seen.down_at is not None else 0.0
    beyond = [life - age for life in recent if life > age]
    if len(beyond) < MIN_EVIDENCE:
        return max(age, statistics.median(recent))
    return statistics.median(beyond)


def take_from_idle_s(s: Situation) -> float:
    """k d / (k - 1) (d with a cross-region transfer): below this predicted lifetime a spot machine
    from idle does not pay."""
    k = max(s.price_ratio, 1.0 + 1e-9)
    return k * s.spot_move_s / (k - 1)


def leave_on_demand_s(s: Situation) -> float:
    """2 k d / (k - 1): above this predicted lifetime a move from on-demand to spot pays (d paid on
    spot, with its transfer, and again on on-demand when spot is reclaimed)."""
    k = max(s.price_ratio, 1.0 + 1e-9)
    return k * (s.spot_move_s + s.move_s) / (k - 1)


def predicted_or_bound_s(s: Situation) -> Optional[float]:
    """The offer's predicted lifetime; for a cross-region zone without evidence, the work left (the
    most its move can save), so that the transfer is always weighed."""
    life = predicted_lifetime_s(s.seen, s.now)
    return s.left_s if life is None and s.crossing else life


def decide(s: Situation) -> Decision:
    if s.left_s <= 0:
        return Decision(IDLE, "no work left")
    if s.deadline is None:
        return _without_deadline(s)
    return _with_deadline(s, s.deadline)


def _with_deadline(s: Situation, deadline: float) -> Decision:
    d = s.move_s
    time_left = deadline - s.now
    earliest = s.now + s.left_s + (0.0 if s.current in (SPOT, ON_DEMAND) else d)
    if earliest > deadline + 1.0:
        # Finish as soon as it can: on the machine it has (a move would only add d), else on-demand.
        market = s.current if s.current in (SPOT, ON_DEMAND) else ON_DEMAND
        return Decision(
            market,
            f"the deadline cannot be met: {_h(s.left_s)} of work left, {_h(max(time_left, 0.0))} to the deadline; "
            f"on {market} to the end, the earliest finish",
            infeasible_at=earliest,
        )
    # The safety net's moment: from then on, one lost machine (noticed after reaction_s, replaced
    # after d, with the controller perhaps away for outage_s) would make the job late.
    net_at = deadline - s.left_s - 2 * d - s.reaction_s - s.outage_s
    if s.now >= net_at:
        return Decision(
            ON_DEMAND,
            f"safety net: {_h(time_left)} to the deadline for {_h(s.left_s)} of work, 2 changeovers and a "
            "loss's detection: on-demand to the end",
        )
    total, span = s.done_s + s.left_s, max(deadline - s.started, 1.0)

    def line(t: float) -> float:  # the uniform line: work that should be done by t
        return total * (t - s.started) / span

    life = predicted_or_bound_s(s) if s.spot_now else None
    if s.spot_now and s.current == SPOT:
        return Decision(SPOT, "spot can be had")
    if s.spot_now and s.current != ON_DEMAND:
        if life is None or life >= take_from_idle_s(s):
            return Decision(SPOT, "spot can be had" + _life(life))
    if s.spot_now and s.current == ON_DEMAND:
        pays = life is None or life >= leave_on_demand_s(s)
        if pays and s.done_s >= line(s.now + 2 * d):
            return Decision(SPOT, "spot can be had and the job is ahead of the uniform line at now + 2d" + _life(life))
        if life is not None and pays:
            return Decision(SPOT, f"spot can be had{_life(life)}, over 2kd/(k-1) = {_h(leave_on_demand_s(s))}")
        why = (
            f"spot can be had, but{_life(life)[1:]}, under 2kd/(k-1) = {_h(leave_on_demand_s(s))}: stays on on-demand"
            if not pays
            else "spot can be had, but the job is behind the uniform line at now + 2d: stays on on-demand"
        )
        return Decision(ON_DEMAND, why, review_at=min(_catch_up_at(s, 2 * d), net_at, s.now + d))
    skipped = s.spot_now  # offered, but predicted too short-lived to pay from idle
    if s.current == ON_DEMAND:
        # Uniform Progress leaves on-demand only for spot: going idle and coming back would pay a
        # second changeover for an outage of unknown length.
        return Decision(ON_DEMAND, "no spot to go to: stays on on-demand", review_at=net_at)
    no_spot = f"spot offered but{_life(life)[1:]}, under kd/(k-1) = {_h(take_from_idle_s(s))}" if skipped else "no spot"
    if s.done_s < line(s.now):
        return Decision(ON_DEMAND, f"{no_spot} and the job is behind the uniform line")
    behind_at = s.started + span * s.done_s / total  # the line reaches the work done
    review = min(behind_at, net_at, s.now + d) if skipped else min(behind_at, net_at)
    return Decision(IDLE, f"{no_spot}; ahead of the uniform line: waits, free", review_at=review)


def _catch_up_at(s: Situation, margin: float) -> float:
    """When a job progressing at full speed from now is ahead of the uniform line at t + margin."""
    assert s.deadline is not None
    rate = (s.done_s + s.left_s) / max(s.deadline - s.started, 1.0)  # the line's slope, < 1
    if rate >= 1.0:
        return float("inf")
    gap = rate * (s.now + margin - s.started) - s.done_s
    return s.now + max(gap, 0.0) / (1.0 - rate)


def _without_deadline(s: Situation) -> Decision:
    life = predicted_or_bound_s(s)
    if s.spot_now and s.crossing and life is not None and life < take_from_idle_s(s):
        # The only spot is in another region and would not repay its checkpoint's transfer.
        s = dataclasses.replace(s, spot_now=False)
    pays = life is not None and life >= leave_on_demand_s(s)
    lost_too_many = s.losses >= s.on_demand_after
    if lost_too_many and not pays:
        return Decision(ON_DEMAND, f"{s.losses} machine(s) of this job lost (on_demand_after = {s.on_demand_after})")
    since = s.now if s.spot_refused_since is None else s.spot_refused_since
    give_up_at = since + s.max_spot_wait_s
    if s.current != ON_DEMAND and s.spot_refused_since is not None and s.now >= give_up_at:
        # Refused that long: on-demand, even if the next try might have had spot.
        return Decision(ON_DEMAND, f"no spot capacity for {_h(s.now - since)} (max_spot_wait_minutes)")
    if s.spot_now:
        if s.current == ON_DEMAND and lost_too_many:
            return Decision(SPOT, "spot can be had again" + _life(life))
        return Decision(SPOT, "spot can be had" + (" again" if s.current == ON_DEMAND else ""))
    if s.current == ON_DEMAND:
        return Decision(ON_DEMAND, "no spot to go back to")
    return Decision(IDLE, f"no spot capacity; waits until {_h(s.max_spot_wait_s)} without it", review_at=give_up_at)


def _life(life: Optional[float]) -> str:
    return "" if life is None else f", its predicted lifetime {_h(life)}"


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.0f} min"
