"""The price of an hour, built from config.toml once (cost.money.Pricing.from_config): what
`orch estimate` quotes is what the daemon bills, on this machine and on a Slurm cluster, where the
instance price is not ours to pay."""

from __future__ import annotations

import time

import pytest

from daemon_harness import orch_home  # noqa: F401  (fixture)
from orchestrator.jobs.estimate import estimate_data
from orchestrator.cost.money import Pricing
from orchestrator.daemon.accounting import accrue_interval
from orchestrator.executors import build_executor
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState
from orchestrator.model.executor_kinds import KINDS
from orchestrator.model.markets import ON_DEMAND, SPOT
from orchestrator.recovery.market import hourly_price

PRICES = {"currency": "USD", "gpu_hour": 2.0, "instance_hour": 10.0, "spot": True, "on_demand_gpu_hour": 6.0}
SLURM = {"executor": {"kind": "slurm"}, "slurm": {"max_gpus": 4}, "pricing": PRICES}


def test_on_this_machine_every_price_of_config_is_kept(orch_home):
    h = orch_home()
    h.configure({"pricing": PRICES})
    assert Pricing.from_config(h.config) == Pricing(
        currency="USD", gpu_hour=2.0, instance_hour=10.0, spot=True, on_demand_gpu_hour=6.0
    )


def test_on_slurm_the_instance_price_is_dropped(orch_home):
    h = orch_home()
    h.configure(SLURM)
    pricing = Pricing.from_config(h.config)
    assert (pricing.gpu_hour, pricing.instance_hour, pricing.on_demand_gpu_hour) == (2.0, 0.0, 6.0)


def test_every_kind_bills_as_its_registry_entry_says(orch_home):
    """Every [executor] kind orch knows (model/executor_kinds.py): config.toml accepts it, the
    executor built for it is that kind, and Pricing.from_config drops the instance price exactly
    when the kind bills by allocation."""
    h = orch_home()
    assert {"local", "slurm", "ray"} <= set(KINDS)
    for kind in KINDS.values():
        h.configure({"executor": {"kind": kind.name}, "pricing": PRICES})
        assert build_executor(h.config, h.home).name == kind.name
        assert (Pricing.from_config(h.config).instance_hour == 0.0) == kind.bills_by_allocation, kind.name


@pytest.mark.parametrize(
    ("gpus", "market", "hour"),
    [
        (2, None, 10.0 + 2 * 2.0),  # this machine's uptime: gpu_hour, whatever the market
        (2, SPOT, 10.0 + 2 * 2.0),
        (2, ON_DEMAND, 10.0 + 2 * 6.0),  # on_demand_gpu_hour when [pricing] gives one
        (0, ON_DEMAND, 10.0),  # a CPU job's machine is its instance alone, on any market
        (0, SPOT, 10.0),
    ],
)
def test_the_one_price_of_an_hour(gpus, market, hour):
    pricing = Pricing(currency="USD", gpu_hour=2.0, instance_hour=10.0, spot=True, on_demand_gpu_hour=6.0)
    assert pricing.machine_hour(gpus, market) == pytest.approx(hour)
    # the recovery controller's budget and policy price a market the same way, from [pricing] as written
    assert hourly_price(pricing, market or SPOT, gpus) == pytest.approx(hour)
    without = Pricing(gpu_hour=2.0, instance_hour=10.0)
    assert without.machine_hour(gpus, ON_DEMAND) == without.machine_hour(gpus, SPOT)  # no on-demand price given


def test_estimate_on_slurm_quotes_what_the_daemon_bills(orch_home):
    """A 2-GPU command job runs half an hour on Slurm and the daemon's accrual bills it; the next
    estimate of the same job.toml (from that history) quotes the same amount, with no instance price."""
    h = orch_home()
    h.configure(SLURM)
    path = h.job_file("train", gpus=2)
    t0 = time.time()
    job_id = submit_job(h.store, h.config, h.home, path, now=t0, machine_gpus=4).id
    h.store.transition(job_id, JobState.RUNNING, EventKind.STARTED, t0, begin_attempt=AttemptStart(1))
    accrue_interval(h.store, h.config, 4, t0, t0 + 1800.0, billable=lambda job: True)
    end = AttemptEnd(ended_at=t0 + 1800.0, outcome=AttemptOutcome.SUCCEEDED, exit_code=0)
    h.store.transition(job_id, JobState.SUCCEEDED, EventKind.SUCCEEDED, t0 + 1800.0, end_attempt=end)
    billed = h.job(job_id)
    assert billed.run_seconds == pytest.approx(1800.0)
    assert billed.cost == pytest.approx(2 * 2.0 * 0.5)  # 2 GPUs x gpu_hour x half an hour, nothing else

    quoted = estimate_data(h.store, h.home, h.config, path, t0 + 1800.0, daemon_running=False)
    assert quoted["hourly_rate"] == pytest.approx(2 * 2.0)
    assert quoted["cost"] == pytest.approx(billed.cost)
