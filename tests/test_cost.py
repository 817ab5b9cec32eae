"""SPEC's one cost formula and what is built on it: waste, ETA, projection, budgets, formatting."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.cost import (
    Pricing,
    Progress,
    Projection,
    StepRateTracker,
    average_hourly_rate,
    budget_exceeded,
    charge_interval,
    eta_seconds,
    format_duration,
    format_hours,
    format_money,
    gpu_hours,
    gpu_seconds,
    job_hourly_rates,
    projected_cost,
    split_interval,
    spot_savings,
    steps_lost,
    total_budget_exceeded,
    waste,
)

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


def test_charge_interval_adds_gpu_seconds_and_runtime():
    charge = charge_interval(1800, [(7, 2), (8, 0)], 4, EXAMPLE)
    assert charge.jobs[7].gpu_seconds == 3600 and charge.jobs[7].seconds == 1800
    assert charge.jobs[8].gpu_seconds == 0
    assert charge.total == pytest.approx(0.5 * EXAMPLE.machine_hour(4))
    assert charge.jobs[7].cost + charge.jobs[8].cost + charge.idle_cost == pytest.approx(charge.total)


def test_hourly_rates_and_gpu_hours():
    rates, machine = job_hourly_rates([(1, 1)], 2, EXAMPLE)
    assert rates == {1: 2.25} and machine == 4.5
    assert gpu_hours(gpu_seconds(5400, 2)) == 3.0
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


def test_waste_is_lost_steps_times_mean_step_time_at_the_job_rate():
    lost = steps_lost(last_step_seen=1250, resumed_from_step=1000)
    assert lost == 250
    seconds, cost = waste(lost, mean_step_s=0.72, job_hourly_rate=2.25)
    assert seconds == pytest.approx(180.0)
    assert cost == pytest.approx(0.1125)


def test_no_waste_when_resuming_at_the_last_step():
    assert steps_lost(1000, 1000) == 0
    assert waste(0, 0.5, 2.25) == (0.0, 0.0)


# --- progress, ETA, projection --------------------------------------------------------------


def test_progress_from_progress_json():
    p = Progress.from_dict(
        {"step": 40, "total_steps": 100, "epoch": 0, "metrics": {"loss": 0.3}, "samples_per_s": 120.5, "updated_at": 17.0}
    )
    assert (p.step, p.total_steps, p.epoch, p.samples_per_s, p.updated_at) == (40, 100, 0, 120.5, 17.0)
    assert p.metrics == {"loss": 0.3}
    assert Progress.from_dict({"step": 1, "updated_at": 2}).total_steps is None


@pytest.mark.parametrize("data", [{}, {"step": "x", "updated_at": 1}, {"step": 1}, {"step": 1, "updated_at": None}])
def test_progress_rejects_garbage(data):
    with pytest.raises(ValueError):
        Progress.from_dict(data)


def test_step_rate_is_smoothed_over_time():
    tracker = StepRateTracker(time_constant_s=60)
    assert tracker.rate() is None
    t0 = 1000.0
    for i in range(0, 301, 5):  # 2 steps/s, observed every 5 s
        tracker.observe(t0 + i, 2 * i)
    assert tracker.rate() == pytest.approx(2.0)
    tracker.observe(t0 + 305, 2 * 300 + 5)  # one slow interval (1 step/s) moves it a little
    assert 1.8 < tracker.rate() < 2.0


def test_step_rate_ignores_rereads_of_the_same_progress():
    tracker = StepRateTracker()
    tracker.observe(100.0, 10)
    tracker.observe(100.0, 10)
    tracker.observe(110.0, 30)
    tracker.observe(110.0, 30)
    assert tracker.rate() == pytest.approx(2.0)


def test_step_rate_survives_a_resume_from_an_older_checkpoint():
    tracker = StepRateTracker()
    tracker.observe(0.0, 0)
    tracker.observe(10.0, 20)
    tracker.reset()  # new attempt after an hour in the queue
    tracker.observe(3600.0, 15)
    assert tracker.rate() == pytest.approx(2.0)
    tracker.observe(3610.0, 35)
    assert tracker.rate() == pytest.approx(2.0)


@pytest.mark.parametrize(
    "step, total, rate, expected",
    [(100, 1100, 2.0, 500.0), (1100, 1100, 2.0, 0.0), (1200, 1100, 2.0, 0.0), (0, None, 2.0, None), (0, 10, None, None), (0, 10, 0.0, None)],
)
def test_eta_seconds(step, total, rate, expected):
    assert eta_seconds(step, total, rate) == expected


def test_projected_cost_with_injected_times():
    tracker = StepRateTracker()
    tracker.observe(1_000.0, 0)
    tracker.observe(1_600.0, 300)  # 0.5 steps/s
    eta = eta_seconds(300, 2100, tracker.rate())
    assert eta == pytest.approx(3600.0)
    projection = projected_cost(cost_so_far=0.25, eta_s=eta, hourly_rate=2.25)
    assert projection == Projection(pytest.approx(2.5), upper_bound=False)
    assert projection.label("CNY") == "≈ 2.50 CNY"


def test_projection_with_early_stopping_is_an_upper_bound():
    projection = projected_cost(1.0, 3600, 1.0, early_stopping=True)
    assert projection.upper_bound and projection.label("CNY") == "≤ 2.00 CNY"
    assert projected_cost(1.0, None, 1.0) is None


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


@pytest.mark.parametrize("amount, currency, text", [(2.25, "CNY", "2.25 CNY"), (2.25, "", "2.25"), (0.004, "USD", "0.00 USD")])
def test_format_money(amount, currency, text):
    assert format_money(amount, currency) == text


@pytest.mark.parametrize(
    "seconds, text", [(None, "-"), (-1, "-"), (45, "45s"), (720, "12m"), (3 * 3600 + 300, "3h 05m"), (2 * 86400 + 4 * 3600, "2d 4h")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_hours():
    assert format_hours(1.5) == "1.50 h"
