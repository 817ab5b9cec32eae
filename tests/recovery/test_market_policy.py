"""The market policy's table of cases (recovery/policy.py): pure, no controller."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.model.markets import IDLE, ON_DEMAND, SPOT
from orchestrator.recovery.policy import Seen, Situation, decide, predicted_lifetime_s

H = 3600.0
D = 0.2 * H  # changeover
# A 48 h job with a deadline 60 h after it came to the controller (Table 3's setup): the uniform
# line asks for 0.8 h of work per hour.
BASE = Situation(
    now=10 * H,
    done_s=8 * H,
    left_s=40 * H,
    spot_now=False,
    current=IDLE,
    changeover_s=D,
    price_ratio=3.14,
    started=0.0,
    deadline=60 * H,
)
LONG_LIVED = Seen(lifetimes_s=(3 * H, 4 * H, 5 * H))  # spot machines here live hours
SHORT_LIVED = Seen(lifetimes_s=(600.0, 600.0, 900.0))  # ... or minutes
TOO_FEW = Seen(lifetimes_s=(5 * H, 5 * H))  # below MIN_EVIDENCE: not believed
AN_HOUR = Seen(lifetimes_s=(H, H, H))
# Most spot machines here lived minutes, a few hours: an offer is judged by its age.
MIXED = (600.0, 600.0, 900.0, 900.0, 4 * H, 5 * H, 6 * H)
FRESH = Seen(lifetimes_s=MIXED, down_at=10 * H)  # spot came back just now
AGED = Seen(lifetimes_s=MIXED, down_at=9 * H)  # spot has been up an hour


FAR = {"transfer_s": 0.1 * H, "transfer_cost_s": 0.5 * H}  # a zone outside the bucket's region


def case(**changes):
    return dataclasses.replace(BASE, **changes)


CASES = [
    # name, situation, market
    ("spot up, idle: take it", case(spot_now=True), SPOT),
    ("spot up, behind the line, idle: take it anyway", case(spot_now=True, done_s=5 * H, left_s=43 * H), SPOT),
    ("spot down, ahead of the line: wait, free", case(done_s=9 * H, left_s=39 * H), IDLE),
    ("spot down, behind the line: on-demand", case(done_s=7 * H, left_s=41 * H), ON_DEMAND),
    ("spot lost while running, behind: on-demand", case(current=SPOT, done_s=7 * H, left_s=41 * H), ON_DEMAND),
    (
        "on-demand, spot up, ahead at now + 2d: back to spot",
        case(current=ON_DEMAND, spot_now=True, done_s=9 * H, left_s=39 * H),
        SPOT,
    ),
    (
        "on-demand, spot up, ahead now but not at now + 2d: stays",
        case(current=ON_DEMAND, spot_now=True, done_s=8.1 * H, left_s=39.9 * H),
        ON_DEMAND,
    ),
    (
        "on-demand, spot up, behind, long-lived spot seen: takes the risk",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=LONG_LIVED),
        SPOT,
    ),
    (
        "on-demand, spot up, behind, short-lived spot seen: stays",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=SHORT_LIVED),
        ON_DEMAND,
    ),
    (
        "on-demand, spot up, behind, too little evidence: stays",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=TOO_FEW),
        ON_DEMAND,
    ),
    (
        "on-demand, no spot, far ahead: stays (no second changeover)",
        case(current=ON_DEMAND, done_s=20 * H, left_s=28 * H),
        ON_DEMAND,
    ),
    (
        "safety net, spot up: on-demand",
        case(now=50 * H, done_s=38 * H, left_s=10 * H - 0.3 * H, spot_now=True),
        ON_DEMAND,
    ),
    (
        "safety net, on spot: on-demand",
        case(now=50 * H, done_s=38.5 * H, left_s=9.7 * H, spot_now=True, current=SPOT),
        ON_DEMAND,
    ),
    ("just before the safety net, spot up: spot", case(now=50 * H, done_s=39 * H, left_s=9 * H, spot_now=True), SPOT),
    ("nothing left", case(done_s=48 * H, left_s=0.0, spot_now=True), IDLE),
    # No deadline.
    ("no deadline, spot up: spot", case(deadline=None, spot_now=True), SPOT),
    ("no deadline, refused 10 min: waits", case(deadline=None, spot_refused_since=10 * H - 600), IDLE),
    ("no deadline, refused past max_spot_wait: on-demand", case(deadline=None, spot_refused_since=8 * H), ON_DEMAND),
    (
        "no deadline, refused past max_spot_wait, a retry due: on-demand, not one more try",
        case(deadline=None, spot_now=True, spot_refused_since=8 * H),
        ON_DEMAND,
    ),
    ("no deadline, on-demand, spot back: spot", case(deadline=None, current=ON_DEMAND, spot_now=True), SPOT),
    ("no deadline, on-demand, no spot: stays", case(deadline=None, current=ON_DEMAND), ON_DEMAND),
    ("no deadline, lost on_demand_after machines: on-demand", case(deadline=None, spot_now=True, losses=3), ON_DEMAND),
    (
        "no deadline, lost them, on-demand, spot back, short-lived: stays",
        case(deadline=None, current=ON_DEMAND, spot_now=True, losses=3, seen=SHORT_LIVED),
        ON_DEMAND,
    ),
    (
        "on-demand, spot up, behind, hour-long spot, free hand-over: 1 h > 2kd/(k-1) = 0.59 h: spot",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=AN_HOUR),
        SPOT,
    ),
    (
        "on-demand, spot up, behind, hour-long spot, 0.4 h hand-over measured: under 1.76 h: stays",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=AN_HOUR, handover_s=0.4 * H),
        ON_DEMAND,
    ),
    (
        "on-demand, ahead at now + 2d, but spot predicted to outlive no move: stays",
        case(current=ON_DEMAND, spot_now=True, done_s=9 * H, left_s=39 * H, seen=SHORT_LIVED),
        ON_DEMAND,
    ),
    (
        "idle, ahead, spot offered but predicted under kd/(k-1): skipped, waits free",
        case(spot_now=True, done_s=9 * H, left_s=39 * H, seen=SHORT_LIVED),
        IDLE,
    ),
    (
        "idle, behind, spot offered but predicted under kd/(k-1): on-demand",
        case(spot_now=True, done_s=7 * H, left_s=41 * H, seen=SHORT_LIVED),
        ON_DEMAND,
    ),
    (
        "on-demand, behind, a fresh offer where most spot lived minutes: stays",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=FRESH),
        ON_DEMAND,
    ),
    (
        "on-demand, behind, the same market's offer an hour old: its survivors lived hours: spot",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=AGED),
        SPOT,
    ),
    (
        "too few lifetimes seen: Uniform Progress (behind: stays on on-demand)",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=TOO_FEW),
        ON_DEMAND,
    ),
    (
        "deadline cannot be met even on on-demand: on-demand, the earliest finish",
        case(now=30 * H, done_s=8 * H, left_s=40 * H, spot_now=True),
        ON_DEMAND,
    ),
    (
        "no deadline, lost them, spot back, long-lived seen: spot",
        case(deadline=None, current=ON_DEMAND, spot_now=True, losses=3, seen=LONG_LIVED),
        SPOT,
    ),
    # Spot only in a zone outside the bucket's region: the checkpoint's transfer (FAR: 6 min of
    # download and egress worth 30 min of on-demand) joins d, k (d + T) / (k - 1) = 1.17 h.
    (
        "far spot, idle, no evidence: the 40 h of work left outweigh the transfer: spot",
        case(spot_now=True, **FAR),
        SPOT,
    ),
    ("near spot, idle, ahead, hour-long spot: 1 h > 0.29 h: spot", case(spot_now=True, seen=AN_HOUR), SPOT),
    (
        "far spot, idle, ahead, hour-long spot: 1 h < 1.17 h: skipped, waits free",
        case(spot_now=True, done_s=9 * H, left_s=39 * H, seen=AN_HOUR, **FAR),
        IDLE,
    ),
    (
        "far spot, idle, behind, hour-long spot: skipped, on-demand (in the bucket's region)",
        case(spot_now=True, done_s=7 * H, left_s=41 * H, seen=AN_HOUR, **FAR),
        ON_DEMAND,
    ),
    (
        "far spot, idle, ahead, 0.5 h of work left, no evidence: under the transfer: waits",
        case(now=10 * H, done_s=47.5 * H, left_s=0.5 * H, spot_now=True, **FAR),
        IDLE,
    ),
    (
        "on-demand, behind, long-lived far spot, egress worth 2 h: 4 h > k (2d + T) / (k - 1) = 3.5 h: spot",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=LONG_LIVED, transfer_cost_s=2 * H),
        SPOT,
    ),
    (
        "on-demand, behind, long-lived far spot, egress worth 3 h: 4 h < 5 h: stays",
        case(current=ON_DEMAND, spot_now=True, done_s=7 * H, left_s=41 * H, seen=LONG_LIVED, transfer_cost_s=3 * H),
        ON_DEMAND,
    ),
    (
        "no deadline, far spot, hour-long spot: under the transfer: waits for spot",
        case(deadline=None, spot_now=True, seen=AN_HOUR, **FAR),
        IDLE,
    ),
    ("no deadline, far spot, no evidence: spot", case(deadline=None, spot_now=True, **FAR), SPOT),
]


@pytest.mark.parametrize("name,situation,market", CASES, ids=[c[0] for c in CASES])
def test_policy_table(name, situation, market):
    decision = decide(situation)
    assert decision.market == market, decision.why
    assert decision.why and "\n" not in decision.why


def test_idle_is_reviewed_when_the_line_catches_up():
    decision = decide(case(done_s=9 * H, left_s=39 * H))
    assert decision.market == IDLE
    # 9 h of 48 is on the line at 9 / 0.8 = 11.25 h.
    assert decision.review_at == pytest.approx(11.25 * H)
    assert decide(case(now=decision.review_at + 1, done_s=9 * H, left_s=39 * H)).market == ON_DEMAND


def test_no_deadline_wait_is_reviewed_at_max_spot_wait():
    decision = decide(case(deadline=None, spot_refused_since=9.5 * H, max_spot_wait_s=H))
    assert (decision.market, decision.review_at) == (IDLE, 10.5 * H)


def test_safety_net_leaves_room_for_a_detected_loss():
    # 0.5 h of reaction time moves the net half an hour earlier.
    at = case(now=49.4 * H, done_s=38.1 * H, left_s=9.9 * H, spot_now=True)
    assert decide(at).market == SPOT
    assert decide(dataclasses.replace(at, reaction_s=0.5 * H)).market == ON_DEMAND


def test_controller_outage_widens_the_safety_net():
    at = case(now=49.4 * H, done_s=38.1 * H, left_s=9.9 * H, spot_now=True)
    assert decide(at).market == SPOT
    assert decide(dataclasses.replace(at, outage_s=0.5 * H)).market == ON_DEMAND


def test_infeasible_deadline_says_the_earliest_finish():
    idle = decide(case(now=30 * H, done_s=8 * H, left_s=40 * H))
    # 40 h of work and a new machine's 0.2 h from 30 h: 70.2 h, after the 60 h deadline.
    assert idle.infeasible_at == pytest.approx(70.2 * H) and "cannot be met" in idle.why
    running = decide(case(now=30 * H, done_s=8 * H, left_s=40 * H, current=ON_DEMAND, handover_s=0.1 * H))
    assert running.infeasible_at == pytest.approx(70 * H)  # it runs already: no new machine to pay
    assert decide(case(now=19 * H, done_s=8 * H, left_s=40 * H)).infeasible_at is None  # 59.2 h: it can


def test_prediction_by_the_offers_age():
    assert predicted_lifetime_s(TOO_FEW, 10 * H) is None
    assert predicted_lifetime_s(FRESH, 10 * H) == pytest.approx(900.0)  # the median of all seven
    assert predicted_lifetime_s(AGED, 10 * H) == pytest.approx(4 * H)  # of 4, 5, 6 h: 3, 4, 5 h left
    # Older than all but two seen: at least as long again as it has been up.
    assert predicted_lifetime_s(Seen(lifetimes_s=MIXED, down_at=0.0), 5.5 * H) == pytest.approx(5.5 * H)
