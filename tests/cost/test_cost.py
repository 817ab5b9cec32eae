"""The one cost formula and what is built on it: spot savings, waste, ETA, projection, budgets,
formatting."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.jobs.attempts import lost_steps_updates
from orchestrator.views.render import projected
from orchestrator.cost.money import (
    Pricing,
    Projection,
    average_hourly_rate,
    budget_exceeded,
    eta_seconds,
    format_duration,
    format_money,
    job_hourly_rates,
    projected_cost,
    split_interval,
    spot_savings,
    total_budget_exceeded,
)
from orchestrator.model.records import Attempt
from orchestrator.model.states import AttemptOutcome
from orchestrator.store import Store

EXAMPLE = Pricing(currency="CNY", gpu_hour=2.0, instance_hour=0.5)


def test_spec_worked_example():
    """2 managed GPUs, gpu_hour 2.0, instance_hour 0.5; a 1-GPU job alone for an hour."""
    jobs, idle = split_interval(3600, [(1, 1)], managed_gpus=2, pricing=EXAMPLE)
    assert jobs == {1: pytest.approx(2.25)}
    assert idle == pytest.approx(2.25)
    assert jobs[1] + idle == pytest.approx(4.5)
    assert EXAMPLE.machine_hour(2) == 4.5


@pytest.mark.parametrize(
    "running, managed, expected_jobs, expected_idle",
    [
        ([], 2, {}, 4.5),  # nothing runs: all idle
        ([(1, 2)], 2, {1: 4.5}, 0.0),  # the whole machine
        ([(1, 1), (2, 1)], 2, {1: 2.25, 2: 2.25}, 0.0),
        ([(1, 1), (2, 0)], 2, {1: 2.25, 2: 0.25}, 2.0),  # CPU job takes the idle GPU's instance share
        ([(1, 2), (2, 0)], 2, {1: 4.5, 2: 0.0}, 0.0),  # busy GPU box: the CPU job rides along
        ([(2, 0), (3, 0)], 2, {2: 0.25, 3: 0.25}, 4.0),  # only CPU jobs: they share instance_hour
    ],
)
def test_machine_share_table(running, managed, expected_jobs, expected_idle):
    jobs, idle = split_interval(3600, running, managed, EXAMPLE)
    assert jobs == pytest.approx(expected_jobs)
    assert idle == pytest.approx(expected_idle, abs=1e-12)


@pytest.mark.parametrize("cpu_jobs", [1, 2, 3])
def test_cpu_only_machine_shares_instance_hour_equally(cpu_jobs):
    pricing = Pricing(currency="USD", gpu_hour=3.0, instance_hour=0.9)
    running = [(f"job{i}", 0) for i in range(cpu_jobs)]
    jobs, idle = split_interval(1800, running, managed_gpus=0, pricing=pricing)
    assert jobs == pytest.approx({job_id: 0.45 / cpu_jobs for job_id, _ in running})
    assert idle == pytest.approx(0.0, abs=1e-12)


def test_cpu_only_machine_with_nothing_running_is_all_idle():
    jobs, idle = split_interval(3600, [], managed_gpus=0, pricing=Pricing(instance_hour=0.1))
    assert jobs == {} and idle == pytest.approx(0.1)


def _random_tables(n: int) -> list[tuple[float, list[tuple[int, int]], int, Pricing]]:
    rng = random.Random(20260918)
    tables = []
    for _ in range(n):
        managed = rng.choice([0, 1, 2, 4, 8])
        free, running = managed, []
        for job_id in range(rng.randint(0, 6)):
            gpus = rng.randint(0, free) if rng.random() < 0.7 else 0
            free -= gpus
            running.append((job_id, gpus))
        pricing = Pricing(gpu_hour=round(rng.uniform(0, 30), 2), instance_hour=round(rng.uniform(0, 5), 3))
        tables.append((rng.uniform(0, 90_000), running, managed, pricing))
    return tables


@pytest.mark.parametrize("seconds, running, managed, pricing", _random_tables(40))
def test_total_is_jobs_plus_idle_is_uptime_times_machine_hour(seconds, running, managed, pricing):
    jobs, idle = split_interval(seconds, running, managed, pricing)
    total = seconds / 3600 * pricing.machine_hour(managed)
    assert math.isclose(math.fsum(jobs.values()) + idle, total, rel_tol=1e-12, abs_tol=1e-9)
    assert idle >= -1e-9 and all(cost >= 0 for cost in jobs.values())
    assert set(jobs) == {job_id for job_id, _ in running}


def test_jobs_holding_more_gpus_than_the_machine_is_a_bookkeeping_error():
    with pytest.raises(ValueError, match="hold 3 GPUs but the daemon manages 2"):
        split_interval(60, [(1, 2), (2, 1)], 2, EXAMPLE)


def test_negative_interval_is_refused():
    with pytest.raises(ValueError):
        split_interval(-1, [], 2, EXAMPLE)


def test_hourly_rates_and_gpu_hours():
    rates, machine = job_hourly_rates([(1, 1)], 2, EXAMPLE)
    assert rates == {1: 2.25} and machine == 4.5
    assert average_hourly_rate(1.125, 1800) == 2.25
    assert average_hourly_rate(0.0, 0) is None


@pytest.mark.parametrize(
    "pricing, expected",
    [
        (Pricing(gpu_hour=1.98, spot=True, on_demand_gpu_hour=3.5), 15.2),
        (Pricing(gpu_hour=1.98, spot=True), None),
        (Pricing(gpu_hour=1.98, on_demand_gpu_hour=3.5), None),
    ],
)
def test_spot_savings(pricing, expected):
    assert spot_savings(10, pricing) == (pytest.approx(expected) if expected else None)


# --- waste ----------------------------------------------------------------------------------


# --- progress, ETA, projection --------------------------------------------------------------


@pytest.mark.parametrize(
    "step, total, rate, expected",
    [
        (100, 1100, 2.0, 500.0),
        (1100, 1100, 2.0, 0.0),
        (1200, 1100, 2.0, 0.0),
        (0, None, 2.0, None),
        (0, 10, None, None),
        (0, 10, 0.0, None),
    ],
)
def test_eta_seconds(step, total, rate, expected):
    assert eta_seconds(step, total, rate) == expected


def test_projected_cost_with_injected_times():
    eta = eta_seconds(300, 2100, 0.5)  # 0.5 steps/s
    assert eta == pytest.approx(3600.0)
    projection = projected_cost(cost_so_far=0.25, eta_s=eta, hourly_rate=2.25)
    assert projection == Projection(pytest.approx(2.5), upper_bound=False)
    assert projected({"projected_cost": projection.cost}, "CNY") == "≈ 2.50 CNY"


def test_projection_with_early_stopping_is_an_upper_bound():
    projection = projected_cost(1.0, 3600, 1.0, early_stopping=True)
    assert projection.upper_bound
    row = {"projected_cost": projection.cost, "projection_is_upper_bound": projection.upper_bound}
    assert projected(row, "CNY") == "≤ 2.00 CNY"
    assert projected_cost(1.0, None, 1.0) is None


# --- waste ----------------------------------------------------------------------------------


def _attempt(n, started, ended, resumed_from, reached):
    return Attempt(
        job_id=1,
        n=n,
        started_at=started,
        ended_at=ended,
        gpu_ids=[],
        exit_code=None,
        exit_signal=None,
        outcome=AttemptOutcome.LOST,
        resumed_from_step=resumed_from,
        step_reached=reached,
    )


def test_waste_is_lost_steps_times_mean_step_time_at_the_job_rate(tmp_path):
    store = Store(tmp_path / "orch.db")
    job = store.submit(name="w", kind="command", gpus=1, priority=0, retries=0, spec={}, spec_path="", now=0.0)
    store.update(job.id, 1.0, cost=2.25, run_seconds=3600.0)
    # 1250 steps in 900 s (0.72 s a step) from step 0; the next attempt resumes from 1000.
    updates = lost_steps_updates(store.get(job.id), [_attempt(1, 100.0, 1000.0, None, 1250)], resume_step=1000)
    assert updates["steps_lost"] == 250
    assert updates["waste_seconds"] == pytest.approx(180.0)
    assert updates["waste_cost"] == pytest.approx(0.1125)  # 180 s at the job's 2.25 an hour


def test_no_waste_when_resuming_at_the_last_step(tmp_path):
    store = Store(tmp_path / "orch.db")
    job = store.submit(name="w", kind="command", gpus=1, priority=0, retries=0, spec={}, spec_path="", now=0.0)
    assert lost_steps_updates(job, [_attempt(1, 0.0, 10.0, None, 1000)], resume_step=1000) == {}


# --- budgets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cost, hours, max_cost, max_hours, reason",
    [
        (12.4, 1.0, 12.0, None, "budget: spent 12.40 CNY of max_cost 12.00"),
        (12.0, 1.0, 12.0, None, "budget: spent 12.00 CNY of max_cost 12.00"),
        (11.99, 1.0, 12.0, None, None),
        (1.0, 48.2, None, 48, "budget: ran 48.20 h of max_hours 48"),
        (13.0, 49.0, 12.0, 48, "budget: spent 13.00 CNY of max_cost 12.00"),
        (1e6, 1e6, None, None, None),
    ],
)
def test_job_budget_reasons(cost, hours, max_cost, max_hours, reason):
    assert budget_exceeded(cost, hours, max_cost, max_hours, "CNY") == reason


@pytest.mark.parametrize(
    "spent, total, reason",
    [
        (500.1, 500.0, "budget: spent 500.10 CNY in all, [budget] total is 500.00"),
        (499.0, 500.0, None),
        (1e9, None, None),
    ],
)
def test_total_budget_reasons(spent, total, reason):
    assert total_budget_exceeded(spent, total, "CNY") == reason


# --- formatting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "amount, currency, text", [(2.25, "CNY", "2.25 CNY"), (2.25, "", "2.25"), (0.004, "USD", "0.00 USD")]
)
def test_format_money(amount, currency, text):
    assert format_money(amount, currency) == text


@pytest.mark.parametrize(
    "seconds, text",
    [(None, "-"), (-1, "-"), (45, "45s"), (720, "12m"), (3 * 3600 + 300, "3h 05m"), (2 * 86400 + 4 * 3600, "2d 4h")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
