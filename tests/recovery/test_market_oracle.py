"""The market benchmark's oracle (benchmarks/marketsim/oracle.py: the cheapest schedule knowing the
trace's future) on cases whose answer is known by hand, and as a lower bound for the policies
replayed through the real controller on the same jobs; and --shuffle-spells' derived traces."""

from __future__ import annotations

import math
import random

from benchmarks import market
from benchmarks.marketsim import baselines
from benchmarks.marketsim.oracle import cheapest, grid_s, job_cost_h
from benchmarks.marketsim.replay import replay, sim_config
from orchestrator.recovery.policy import decide
from orchestrator.store import Store

K = 3.14


def test_oracle_on_cases_known_by_hand():
    # 10 steps of work, 14 steps to the deadline, a boot of 2 steps.
    assert math.isclose(cheapest([1] * 14, 10, 14, 2, K), (10 + 2) / K)  # spot throughout: one boot
    assert math.isclose(cheapest([0] * 14, 10, 14, 2, K), 10 + 2)  # no spot: on-demand, one boot
    assert cheapest([0] * 11, 10, 11, 2, K) == float("inf")  # no time for the boot
    assert math.isclose(cheapest([1] * 14, 10, 14, 2, K, paper=True), 10 / K)  # boots free
    # Spot for the first 6 steps only, slack 4: spot 2 boot + 4 work, then on-demand booting
    # while spot still works (a planned move), 6 more on-demand.
    assert math.isclose(cheapest([1] * 6 + [0] * 8, 10, 14, 2, K), 6 / K + 2 + 6)
    # An outage of 4 steps in the middle fits in the slack: wait it out rather than pay on-demand.
    assert math.isclose(cheapest([1] * 5 + [0] * 4 + [1] * 9, 10, 18, 2, K), (2 + 3 + 2 + 7) / K)


def test_grid_follows_the_trace_and_the_changeover():
    assert grid_s(600, 720) == 120  # Table 3: 10-minute ticks, 0.2 h changeover
    assert grid_s(600, 1440) == 120  # 0.4 h
    assert grid_s(600, 72) is None  # 0.02 h: a 24 s grid, too fine


def test_no_policy_through_the_controller_beats_the_oracle(tmp_path):
    rng = random.Random(7)
    values = [1 if rng.random() < 0.7 else 0 for _ in range(200)]  # 10-minute ticks, about 33 h
    for v in range(1, len(values)):  # spells of a few ticks, not single ticks
        if rng.random() < 0.6:
            values[v] = values[v - 1]
    kw = dict(job_h=6.0, deadline_h=9.0)
    for start in (0, 40, 90):
        store = Store(tmp_path / f"orch-{start}.db")
        try:
            for policy in (decide, baselines.uniform_progress, baselines.greedy, baselines.on_demand):
                r = replay(values, 600.0, start, policy, config=sim_config(changeover_h=0.2), store=store, **kw)
                assert not r.missed
                for paper in (False, True):
                    bound = job_cost_h(values, 600.0, start, changeover_h=0.2, price_ratio=K, paper=paper, **kw)
                    assert bound is not None
                    paid = r.od_work_h + r.spot_work_h / K if paper else r.od_h + r.spot_h / K
                    assert bound <= paid + 1e-9, (start, policy, paper, bound, paid)
        finally:
            store.close()


def test_shuffled_spells_keep_the_spells_and_the_share_of_spot():
    values = [1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1]
    got = market.shuffle_spells(values, random.Random(3))
    assert len(got) == len(values) and sum(got) == sum(values) and got[0] == values[0]

    def spells(v):
        out, n = [], 1
        for a, b in zip(v, v[1:]):
            if a == b:
                n += 1
            else:
                out.append((a, n))
                n = 1
        return sorted(out + [(v[-1], n)])

    assert spells(got) == spells(values)
