"""The price of an hour, built from config.toml once (cost.money.Pricing.from_config): what
`orch estimate` quotes is what the daemon bills, on this machine and on a Slurm cluster, where the
instance price is not ours to pay."""

from __future__ import annotations

import time
import typing

import pytest

from daemon_harness import orch_home  # noqa: F401  (fixture)
from orchestrator.jobs.estimate import estimate_data
from orchestrator.cost.money import ALLOCATION_BILLED, Pricing
from orchestrator.daemon.accounting import accrue_interval
from orchestrator.executors import build_executor
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState
from orchestrator.spec.config import ExecutorSection

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


def test_the_executors_that_bill_by_allocation_are_the_ones_pricing_names(orch_home):
    """Every [executor] kind config.toml accepts: the executor built for it bills by allocation
    exactly when Pricing.from_config drops the instance price (a new kind must say which it is)."""
    h = orch_home()
    kinds = typing.get_args(ExecutorSection.model_fields["kind"].annotation)
    assert "local" in kinds and "slurm" in kinds
    for kind in kinds:
        h.configure({"executor": {"kind": kind}, "pricing": PRICES})
        executor = build_executor(h.config, h.home)
        assert executor.bills_by_allocation == (kind in ALLOCATION_BILLED), kind
        assert (Pricing.from_config(h.config).instance_hour == 0.0) == executor.bills_by_allocation, kind


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
