"""The one budget stop and `orch run`'s own share, as pure calls on a real store (no daemon, no
job process): jobs/budget_stop.py decides for the daemon's tick and a lone `orch run` alike;
cost/own_share.py charges by the one cost formula (docs/cost.md)."""

from __future__ import annotations

import time

import pytest

from orchestrator.cost.money import Pricing
from orchestrator.cost.own_share import own_share
from orchestrator.home.paths import Home
from orchestrator.jobs.budget_stop import budget_reason, record_stop, total_budget_reason
from orchestrator.model.records import AttemptStart
from orchestrator.model.states import EventKind, Intent, JobState
from orchestrator.spec.config import Config
from orchestrator.store import Store

PRICING = Pricing(currency="CNY", gpu_hour=2.0, instance_hour=0.5)


def test_own_share_is_the_worked_example_of_the_one_formula():
    # 2 managed GPUs, gpu_hour 2.0, instance_hour 0.5: a 1-GPU job alone for an hour costs 2.25 (docs/cost.md)
    assert own_share(3600, 7, 1, [], 2, PRICING) == pytest.approx(2.25)
    # beside another 1-GPU job it still takes its own share, not half the machine
    assert own_share(3600, 7, 1, [(7, 1), (8, 1)], 2, PRICING) == pytest.approx(2.25)
    # CPU jobs on a GPU-less machine split instance_hour among the running ones
    assert own_share(3600, 7, 0, [(8, 0)], 0, PRICING) == pytest.approx(0.25)
    assert own_share(0, 7, 1, [], 2, PRICING) == 0.0


def test_own_share_bills_its_own_gpus_when_more_are_held_than_managed():
    assert own_share(1800, 7, 2, [(8, 2)], 2, PRICING) == pytest.approx(2 * 2.0 / 2)


@pytest.fixture
def store(tmp_path):
    home = Home(tmp_path / "home").ensure()
    s = Store(home.db)
    yield s
    s.close()


def running_job(store: Store, *, max_cost=None, max_hours=None):
    job = store.submit(
        name="b",
        kind="command",
        gpus=0,
        priority=0,
        retries=0,
        spec={"command": ["x"]},
        spec_path="",
        now=time.time(),
        max_cost=max_cost,
        max_hours=max_hours,
    )
    store.transition(job.id, JobState.RUNNING, EventKind.STARTED, time.time(), begin_attempt=AttemptStart(1))
    return store.get(job.id)


def config(total=None) -> Config:
    return Config.model_validate({"pricing": {"currency": "CNY"}, "budget": {"total": total}})


def test_a_job_past_its_max_cost_is_stopped_once(store):
    job = running_job(store, max_cost=1.0)
    assert budget_reason(job, config(), None) is None
    store.charge_job(job.id, 60, 1.5, 0)
    job = store.get(job.id)
    reason = budget_reason(job, config(), total_budget_reason(store, config()))
    assert reason and "max_cost" in reason
    assert record_stop(store, job, Intent.BUDGET, time.time(), reason)
    stopped = store.get(job.id)
    assert stopped.intent is Intent.BUDGET and stopped.signalled_at and stopped.reason == reason
    # stopping already: neither asked again nor recorded twice
    assert budget_reason(stopped, config(), None) is None
    assert not record_stop(store, stopped, Intent.BUDGET, time.time(), reason)


def test_the_total_budget_stops_every_running_job(store):
    job = running_job(store)
    store.charge_job(job.id, 60, 5.0, 0)
    total = total_budget_reason(store, config(total=4.0))
    assert total and "[budget] total" in total
    assert budget_reason(store.get(job.id), config(total=4.0), total) == total
    assert total_budget_reason(store, config(total=None)) is None
