"""The controller places jobs by the market policy every pass (recovery/deciding.py + policy.py),
replayed on the market benchmark's simulated cloud (benchmarks/marketsim: a spot market from an
availability trace, machines that adopt and hand over as orch's daemon does) with a jumping clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.marketsim import baselines
from benchmarks.marketsim.replay import replay, sim_config
from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import manifest as mf
from orchestrator.recovery.policy import decide
from orchestrator.store import Store

TICK = 600.0  # 10 minutes


def run(tmp_path: Path, values: list[int], policy=decide, **kw):
    store = Store(tmp_path / "orch.db")
    try:
        return replay(values, TICK, 0, policy, config=sim_config(changeover_h=0.2), store=store, **kw)
    finally:
        store.close()


def test_spot_refused_on_demand_meanwhile_then_a_planned_move_back_to_spot(tmp_path):
    # No spot for the first 2 h, then spot for good: a 10 h job with 14 h to its deadline.
    values = [0] * 12 + [1] * 200
    r = run(tmp_path, values, job_h=10.0, deadline_h=14.0)
    assert not r.missed and not r.given_up
    assert r.od_h > 0 and r.spot_h > 0  # on-demand while behind, spot once it came back
    assert r.spot_work_h > 0  # the move to spot happened: the job trained there


def test_capacity_refusals_never_count_toward_max_launches(tmp_path):
    # Spot for an hour, gone for an hour, for days: dozens of refusals and reclaims.
    values = ([1] * 6 + [0] * 6) * 40
    r = run(tmp_path, values, job_h=20.0, deadline_h=40.0)
    assert not r.given_up and not r.missed
    assert r.machines > 10  # past max_launches = 10: reclaims and refusals are the market, not failures


@pytest.mark.parametrize("policy", [decide, baselines.uniform_progress, baselines.greedy])
def test_no_policy_misses_a_feasible_deadline_on_a_hostile_market(tmp_path, policy):
    # Spot for 50 minutes, gone for 70, all along: the safety net must still land the job.
    values = ([1] * 5 + [0] * 7) * 60
    r = run(tmp_path, values, policy, job_h=6.0, deadline_h=7.0)
    assert not r.missed and not r.given_up


def test_a_move_launches_the_new_machine_before_asking_the_holder(tmp_path):
    # Spot refused for the first 2 h (the job starts on on-demand), then available for good.
    r = run(tmp_path, [0] * 12 + [1] * 100, job_h=3.0, deadline_h=6.0)
    world = r.world
    moved = [c for c in cl.read_claims(world.remote, world.uid) if c.extra.get("move_for")]
    assert moved and moved[0].market == "spot" and moved[0].status == cl.LAUNCHED
    # The on-demand machine kept working until the spot machine had booted, then handed over.
    od = [m for m in world.machines.values() if m.market == "on-demand"]
    spot = [m for m in world.machines.values() if m.market == "spot" and m.adopted]
    assert od and spot and od[0].end_at >= spot[0].ready_at - 1
    assert od[0].end_at - od[0].launched_at < 3.0 * 3600  # stopped once moved, not run to the end
    assert not r.missed and r.spot_work_h > 0


def test_every_adoption_pays_the_hand_over_and_the_policy_measures_it(tmp_path):
    # Spot for 2 h, gone for 20 min, all along: each reclaim brings a new machine, which boots and
    # then resumes for the hand-over before it makes progress.
    values = ([1] * 12 + [0] * 2) * 30
    free = run(tmp_path / "free", values, job_h=8.0, deadline_h=16.0)
    paid = run(tmp_path / "paid", values, job_h=8.0, deadline_h=16.0, handover_h=0.25)
    assert not paid.missed and not paid.given_up
    adopted = paid.world.adopted
    assert len(adopted) >= 3
    for m in adopted:  # no progress before the hand-over's end: each machine's work fits after it
        assert m.resume_at == pytest.approx(m.adopted_at + 0.25 * 3600)
        assert m.work_s <= m.end_at - m.resume_at + 1e-6
    # The hand-overs are billed: more machine hours for the same work.
    assert paid.od_h + paid.spot_h > free.od_h + free.spot_h
    # What the controller reads from the manifest's machines: the hand-over, measured.
    from orchestrator.recovery.deciding import handover_s

    m = json.loads(paid.world.remote.get_bytes(mf.manifest_key(paid.world.uid)))
    assert handover_s(m) == pytest.approx(0.25 * 3600, abs=60)


def test_an_infeasible_deadline_is_said_once_as_soon_as_the_pace_is_known(tmp_path):
    # 10 h of work, 8 h to the deadline: it cannot be met, even on on-demand.
    store = Store(tmp_path / "orch.db")
    try:
        r = replay(
            [1] * 200, TICK, 0, decide, config=sim_config(changeover_h=0.2), store=store, job_h=10.0, deadline_h=8.0
        )
        events = [e for e in store.recovery_events() if e["kind"] == "deadline_infeasible"]
    finally:
        store.close()
    assert r.missed  # it could not be met
    assert len(events) == 1 and "earliest finish" in events[0]["detail"]
    # Said when the first progress was read, long before the deadline passed.
    assert events[0]["at"] < r.world.submitted_at + 1 * 3600
