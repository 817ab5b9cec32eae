"""The arithmetic of cost planning, rule by rule: the goodput ledger's parts, each advice rule and
the saving it states, the estimate's projection (wall time, saves, cost, preemption waste), the
evaluations a job runs, and the queue forecast. Plain records in, numbers out."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from orchestrator.cost.advice import (
    LARGE_SHARE,
    checkpoint_advice,
    data_wait_advice,
    idle_advice,
    job_advice,
    redone_advice,
    startup_advice,
)
from orchestrator.jobs.estimate import hourly_rate
from orchestrator.planning.projection import builtin_projection, checkpoint_plan, command_projection
from orchestrator.contract import young_daly
from orchestrator.cost.money import Pricing
from orchestrator.planning.forecast import History, history_of, simulate
from orchestrator.spec.jobspec import JobSpec
from orchestrator.cost.ledger import PARTS, Ledger, job_ledger, sum_ledgers
from orchestrator.model.records import Attempt, Job
from orchestrator.model.states import AttemptOutcome, Intent, JobState
from training.ahead.probe import evals_per_epoch, probe_spec


def make_job(**kw: Any) -> Job:
    base: dict[str, Any] = {f.name: None for f in dataclasses.fields(Job)}
    base.update(
        id=1,
        name="j",
        state=JobState.SUCCEEDED,
        priority=0,
        gpus=0,
        kind="builtin",
        spec_json="{}",
        spec_path="",
        after_ids=[],
        retries=0,
        failures=0,
        attempt=1,
        intent=Intent.NONE,
        reason="",
        submitted_at=0.0,
        updated_at=0.0,
        gpu_ids=[],
        cost=0.0,
        run_seconds=0.0,
        gpu_seconds=0.0,
        waste_seconds=0.0,
        waste_cost=0.0,
        steps_lost=0,
        uid="u",
        executor="local",
        executor_ref={},
    )
    base.update(kw)
    return Job(**base)


def make_attempt(n: int, started: float, ended: float | None) -> Attempt:
    return Attempt(
        job_id=1,
        n=n,
        started_at=started,
        ended_at=ended,
        gpu_ids=[],
        exit_code=0,
        exit_signal=None,
        outcome=AttemptOutcome.SUCCEEDED,
        resumed_from_step=None,
        step_reached=None,
    )


def figures(first: float | None, data: float, ckpt: float, ev: float, step_s: float, steps: int) -> dict[str, Any]:
    return {
        "first_step_at": first,
        "data_wait_s": data,
        "checkpoint_s": ckpt,
        "eval_s": ev,
        "step_s": step_s,
        "steps": steps,
    }


# -- the ledger ----------------------------------------------------------------------------------


def test_ledger_parts_are_the_measured_waste_and_useful_is_the_rest_of_the_bill():
    job = make_job(cost=36.0, run_seconds=3600.0, steps_lost=20, attempt=2)
    attempts = [make_attempt(1, 1000.0, 1500.0), make_attempt(2, 2000.0, 5000.0)]
    goodput = {"1": figures(1010.0, 5.0, 3.0, 2.0, 100.0, 100), "2": figures(2030.0, 5.0, 1.0, 2.0, 50.0, 50)}
    ledger = job_ledger(job, attempts, goodput, now=9999.0)
    assert ledger.seconds == pytest.approx(
        {
            "startup": 40.0,
            "data_wait": 10.0,
            "checkpoint": 4.0,
            "eval": 4.0,
            "redone": 20.0,  # 20 steps x (150 s / 150 steps)
            "useful": 3600.0 - 78.0,
        }
    )
    assert ledger.money["redone"] == pytest.approx(0.2) and ledger.money["useful"] == pytest.approx(35.22)
    assert ledger.total == pytest.approx(36.0) and ledger.measured and not ledger.scaled and ledger.attempts == 2


def test_ledger_an_attempt_that_never_reached_a_step_was_all_start_up():
    job = make_job(cost=1.0, run_seconds=100.0, attempt=2)
    ledger = job_ledger(
        job,
        [make_attempt(1, 0.0, 30.0), make_attempt(2, 40.0, None)],
        {"2": figures(50.0, 0.0, 0.0, 0.0, 10.0, 10)},
        now=100.0,
    )
    assert ledger.seconds["startup"] == pytest.approx(30.0 + 10.0)


def test_ledger_measured_parts_beyond_the_bill_are_scaled_to_it_and_still_add_up():
    job = make_job(cost=2.0, run_seconds=10.0)
    ledger = job_ledger(job, [make_attempt(1, 0.0, 50.0)], {"1": figures(20.0, 10.0, 0.0, 0.0, 5.0, 5)}, now=60.0)
    assert ledger.scaled and ledger.seconds["useful"] == 0.0
    assert ledger.seconds["startup"] == pytest.approx(20.0 / 3) and ledger.seconds["data_wait"] == pytest.approx(
        10.0 / 3
    )
    assert ledger.total == pytest.approx(2.0)


def test_ledger_of_a_job_without_figures_knows_only_its_redone_steps():
    job = make_job(cost=10.0, run_seconds=1000.0, waste_seconds=100.0, steps_lost=7, kind="command")
    ledger = job_ledger(job, [make_attempt(1, 0.0, 1000.0)], None, now=2000.0)
    assert not ledger.measured and ledger.notes
    assert ledger.seconds["redone"] == 100.0 and ledger.seconds["useful"] == 900.0 and ledger.seconds["startup"] == 0.0
    assert ledger.total == pytest.approx(10.0)


def test_sum_of_ledgers_is_each_part_summed():
    a = Ledger({p: 1.0 for p in PARTS}, {p: 2.0 for p in PARTS}, 6.0, 12.0, True)
    b = Ledger({p: 3.0 for p in PARTS}, {p: 4.0 for p in PARTS}, 18.0, 24.0, True)
    summed = sum_ledgers([a, b])
    assert summed["seconds"]["redone"] == 4.0 and summed["money"]["useful"] == 6.0


# -- advice --------------------------------------------------------------------------------------


def ledger_with(part: str, money: float, billed: float = 100.0, attempts: int = 1) -> Ledger:
    seconds = {p: 0.0 for p in PARTS}
    spent = {p: 0.0 for p in PARTS}
    seconds[part], spent[part] = money * 36.0, money  # 100 per hour
    spent["useful"] = billed - money
    return Ledger(seconds, spent, billed * 36.0, billed, True, attempts=attempts)


def test_checkpoint_advice_background_saves_all_a_longer_interval_half_and_auto_nothing():
    ledger = ledger_with("checkpoint", 20.0)
    line = checkpoint_advice(ledger, {"checkpoint": {"background": False}}, "CNY")
    assert "background = true" in line and "up to 20.00 CNY" in line
    line = checkpoint_advice(ledger, {"checkpoint": {"background": True, "every_n_steps": 50}}, "CNY")
    assert "every_n_steps = 100" in line and "saves 10.00 CNY" in line
    line = checkpoint_advice(ledger, {"checkpoint": {"every_minutes": 10}}, "")
    assert "every_minutes = 20" in line and "saves 10.00" in line
    assert checkpoint_advice(ledger, {"checkpoint": {"every": "auto"}}, "") is None


def test_advice_is_silent_for_a_small_part():
    small = ledger_with("checkpoint", LARGE_SHARE * 100.0 * 0.99)
    assert checkpoint_advice(small, {"checkpoint": {"background": False}}, "") is None
    assert job_advice(ledger_with("eval", 50.0), {}, "") == []  # evaluation has no rule: it is asked for


def test_redone_data_wait_and_startup_advice_state_their_savings():
    assert "up to 12.00" in redone_advice(ledger_with("redone", 12.0), {"checkpoint": {}}, "")
    assert 'every = "auto"' in redone_advice(ledger_with("redone", 12.0), {"checkpoint": {}}, "")
    line = data_wait_advice(ledger_with("data_wait", 8.0), {"data": {"num_workers": 0}}, "")
    assert "num_workers = 4 (now 0)" in line and "up to 8.00" in line
    assert "num_workers = 4 (now 2)" in data_wait_advice(
        ledger_with("data_wait", 8.0), {"data": {"num_workers": 2}}, ""
    )
    line = startup_advice(ledger_with("startup", 9.0, attempts=3), {}, "")
    assert "up to 6.00" in line and "2 of 3 starts" in line  # the first start tokenizes anyway
    assert startup_advice(ledger_with("startup", 9.0, attempts=1), {}, "") is None


def test_idle_advice_counts_at_most_the_shutdown_delay_per_idle_stretch():
    # 30.00 idle of 100, machine 6.00/h, 2 idle stretches, 10 min each kept: 2 x 1.00 = 2.00 kept
    line = idle_advice(30.0, 100.0, None, 6.0, 2, "CNY")
    assert "shutdown_after_minutes = 10" in line and "saves 28.00 CNY" in line
    line = idle_advice(30.0, 100.0, 60.0, 6.0, 2, "")  # set at 60: advise 30 -> 2 x 3.00 kept
    assert "shutdown_after_minutes = 30 (now 60)" in line and "saves 24.00" in line
    assert idle_advice(1.0, 100.0, None, 6.0, 1) is None


# -- the estimate ----------------------------------------------------------------------------------


def spec_of(**kw: Any) -> JobSpec:
    return JobSpec.model_validate({"model": {"name_or_path": "m"}, "data": {"train": "t.jsonl"}, **kw})


PROBE = {
    "steps_per_s": 10.0,
    "total_steps": 1000,
    "startup_s": 20.0,
    "checkpoint_s": 0.5,
    "eval_pass_s": 4.0,
    "end_s": 2.0,
    "evals": 3.0,
    "probe_s": 30.0,
    "warmup_steps": 10,
    "steady_steps": 30,
}


def test_builtin_projection_adds_start_up_training_evaluation_saves_and_the_end():
    spec = spec_of(gpus=1, checkpoint={"every_n_steps": 300})
    d = builtin_projection(spec, PROBE, rate_hour=3.6, mtbf=(3600.0, "test"))
    # training 100 s, a save every 30 s -> 3 + the final one, 3 evaluations of 4 s
    assert d["saves"] == 4 and d["checkpoint_interval_s"] == 30.0
    assert d["wall_s"] == pytest.approx(20 + 100 + 12 + 4 * 0.5 + 2)
    assert d["cost"] == pytest.approx(d["wall_s"] / 3600 * 3.6, rel=1e-4)
    assert d["gpu_hours"] == pytest.approx(d["wall_s"] / 3600, rel=1e-3)
    # preemptions expected: wall / MTBF, each losing half an interval and a restart
    assert d["preemption_waste_s"] == pytest.approx(d["wall_s"] / 3600 * (15 + 20), abs=0.06)  # to 0.1 s
    assert d["probe"]["cost"] == pytest.approx(30 / 3600 * 3.6, rel=1e-3)


def test_checkpoint_plan_auto_uses_young_daly_and_the_shorter_of_steps_and_minutes():
    interval, why = checkpoint_plan(spec_of(checkpoint={"every": "auto"}), 10.0, 2.0, 7200.0)
    assert interval == pytest.approx(young_daly(2.0, 7200.0)) == pytest.approx(math.sqrt(2 * 2 * 7200))
    assert "auto" in why
    interval, _ = checkpoint_plan(spec_of(checkpoint={"every_n_steps": 6000, "every_minutes": 5}), 10.0, 1.0, 1.0)
    assert interval == 300.0
    interval, _ = checkpoint_plan(spec_of(checkpoint={"every_n_steps": 600}), 10.0, 1.0, 1.0)
    assert interval == 60.0  # min(600 steps at 10/s, the default 10 minutes)


def test_command_projection_from_history_or_says_it_cannot():
    spec = JobSpec.model_validate({"name": "mine", "command": ["x"], "gpus": 0})
    assert "cannot" in command_projection(spec, None, 1.0)["cannot_estimate"]
    d = command_projection(spec, History(runs=2, seconds=1800.0, cost=0.4), 2.0)
    assert d["wall_s"] == 1800.0 and d["cost"] == pytest.approx(1.0) and d["history_runs"] == 2


def test_hourly_rate_is_the_one_cost_formula_for_the_job_alone():
    pricing = Pricing(gpu_hour=2.0, instance_hour=1.0)
    assert hourly_rate(pricing, 0, 0) == 1.0  # a CPU job on a GPU-less machine pays the instance
    assert hourly_rate(pricing, 1, 2) == pytest.approx(2.0 + 0.5)


def test_evaluations_per_epoch_follow_lightnings_rule():
    assert evals_per_epoch(1.0, 63) == 1
    assert evals_per_epoch(0.25, 63) == 4  # every int(63 x 0.25) = 15 batches
    assert evals_per_epoch(20, 63) == 63 / 20  # counted across epochs
    assert evals_per_epoch(100, 63) == 0.63


def test_the_probe_runs_few_steps_one_save_no_early_stop_and_one_evaluation():
    spec = spec_of(
        early_stopping={"monitor": "val_acc"},
        checkpoint={"every": "auto", "every_minutes": 5},
        train={"max_epochs": 3, "val_check_interval": 0.5},
    ).to_toml_dict()
    body = probe_spec(spec, 40, steps_per_epoch=100, accumulate=2, batches_per_epoch=200, has_val=True)
    assert body["train"]["max_steps"] == 40 and body["train"]["max_epochs"] == 2
    assert "early_stopping" not in body and "every" not in body["checkpoint"]
    assert body["checkpoint"]["every_n_steps"] == 40 and body["train"]["val_check_interval"] == 0.4  # 80 of 200 batches
    short = probe_spec(spec, 40, steps_per_epoch=10, accumulate=1, batches_per_epoch=10, has_val=True)
    assert short["train"]["val_check_interval"] == 0.5  # epochs end inside the probe: its own setting runs
    assert json.loads(json.dumps(spec)) == spec  # the job's own spec is untouched


# -- the forecast ------------------------------------------------------------------------------------


def test_simulate_starts_queued_jobs_as_slots_free_and_marks_unknown_run_times():
    now = 1000.0
    running = [(make_job(id=1, gpus=1, state=JobState.RUNNING, started_at=900.0), 100.0)]
    queue = [
        (make_job(id=2, gpus=2, state=JobState.QUEUED), 50.0),
        (make_job(id=3, gpus=1, state=JobState.QUEUED), None),
        (make_job(id=4, gpus=1, state=JobState.QUEUED), 10.0),
        (make_job(id=5, gpus=0, state=JobState.QUEUED), 5.0),
    ]
    out = simulate(running, queue, gpus=2, cpu_slots=1, now=now)
    assert out[1].finish == 1100.0
    assert out[2].start == 1100.0 and out[2].finish == 1150.0  # waits for both GPUs
    assert out[3].start == 1150.0 and out[3].finish is None
    assert out[4].start == 1150.0 and out[4].lower_bound  # behind a job of unknown length
    assert out[5].start == now and out[5].finish == now + 5.0


def test_history_is_the_mean_of_finished_jobs_of_the_same_name():
    jobs = [
        make_job(id=1, name="a", run_seconds=10.0, cost=1.0),
        make_job(id=2, name="a", run_seconds=30.0, cost=3.0),
        make_job(id=3, name="a", state=JobState.FAILED, run_seconds=99.0),
        make_job(id=4, name="b", run_seconds=5.0),
    ]
    h = history_of(jobs, "a")
    assert h == History(runs=2, seconds=20.0, cost=2.0, seconds_min=10.0, seconds_max=30.0, cost_max=3.0)
    assert history_of(jobs, "c") is None


def test_estimate_does_not_say_now_when_a_job_ahead_has_no_eta_yet():
    from orchestrator.views.estimate import estimate_text

    running = make_job(id=1, name="t0", state=JobState.RUNNING, started_at=0.0)
    forecast = simulate(
        [(running, None)],
        [(dataclasses.replace(running, id=2, state=JobState.QUEUED), 60.0)],
        gpus=0,
        cpu_slots=1,
        now=100.0,
    )[2]
    assert forecast.start == 100.0 and forecast.lower_bound  # the job ahead counts as ending now
    base = {
        "job": "q",
        "gpus": 0,
        "currency": "",
        "hourly_rate": 0.0,
        "kind": "command",
        "cannot_estimate": "never seen",
        "queue_ahead": 1,
        "daemon_running": True,
    }
    text = estimate_text({**base, "queue_wait_s": 0.0, "queue_wait_is_lower_bound": True})
    starts = [line for line in text.splitlines() if "starts:" in line][0]
    assert "or later" in starts, starts
    assert "starts:      now (" in estimate_text({**base, "queue_wait_s": 0.0, "queue_wait_is_lower_bound": False})
