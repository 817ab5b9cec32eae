"""The paper's policies ("Can't Be Late", Wu et al., NSDI'24, section 4), in the shape of
orchestrator.recovery.policy.decide, so the benchmark runs them through the same controller:

- on_demand: on-demand only.
- greedy: spot while it can be had, idle otherwise; on-demand for good once the time left is
  under the work left + 2d.
- uniform_progress: take spot whenever it can be had (from idle); when it cannot and the job is
  behind the uniform line t * C / R, on-demand; leave on-demand (for spot) only when ahead of the
  line at t + 2d; the same safety net.

Their safety net also leaves room for the controller's reaction time (a lost machine is noticed
after stale_after + a poll), exactly as orch's policy does: the paper's simulator decides at every
tick with no detection delay, and without that room a job on spot at the net's moment is late.
Before a job's pace is measured (its first minutes) no policy can know its slack: all of them
then follow orch's rule for it (spot if it can be had, else on-demand)."""

from __future__ import annotations

from orchestrator.model.markets import IDLE, ON_DEMAND, SPOT
from orchestrator.recovery.policy import Decision, Situation, decide


def on_demand(s: Situation) -> Decision:
    if s.left_s <= 0:
        return Decision(IDLE, "no work left")
    return Decision(ON_DEMAND, "on-demand only")


def _net_at(s: Situation) -> float:
    assert s.deadline is not None
    return s.deadline - s.left_s - 2 * s.move_s - s.reaction_s


def greedy(s: Situation) -> Decision:
    if s.left_s <= 0:
        return Decision(IDLE, "no work left")
    if s.deadline is None:  # no deadline, or no pace measured yet: orch's own rule
        return decide(s)
    if s.now >= _net_at(s):
        return Decision(ON_DEMAND, "safety net")
    if s.spot_now:
        return Decision(SPOT, "spot can be had")
    return Decision(IDLE, "no spot: waits", review_at=_net_at(s))


def uniform_progress(s: Situation) -> Decision:
    if s.left_s <= 0:
        return Decision(IDLE, "no work left")
    if s.deadline is None:
        return decide(s)
    net_at = _net_at(s)
    if s.now >= net_at:
        return Decision(ON_DEMAND, "safety net")
    total, span = s.done_s + s.left_s, max(s.deadline - s.started, 1.0)
    rate = total / span

    def line(t: float) -> float:
        return rate * (t - s.started)

    if s.current == ON_DEMAND:
        margin = 2 * s.move_s
        if s.spot_now and s.done_s >= line(s.now + margin):
            return Decision(SPOT, "ahead of the line at t + 2d and spot can be had")
        catch_up = s.now + max(line(s.now + margin) - s.done_s, 0.0) / max(1.0 - rate, 1e-9)
        return Decision(ON_DEMAND, "hysteresis: stays on on-demand", review_at=min(catch_up, net_at))
    if s.spot_now:
        return Decision(SPOT, "spot can be had")
    if s.done_s < line(s.now):
        return Decision(ON_DEMAND, "behind the uniform line, no spot")
    behind_at = s.started + s.done_s / rate
    return Decision(IDLE, "ahead of the uniform line: waits", review_at=min(behind_at, net_at))


POLICIES = {"greedy": greedy, "uniform_progress": uniform_progress, "on_demand": on_demand}
