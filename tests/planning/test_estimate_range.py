"""The estimate as a range that holds under load (pure, no probe): the fair-share model of the
cores, a CPU-bound step slowing with its share and a GPU-bound one hardly at all, the range around
the probe, a sweep's "at most" with its trials' load, and a command sweep estimated from its
trials' history (`<sweep>-tN`)."""

from __future__ import annotations

import pytest

from orchestrator.planning.projection import builtin_projection, command_projection
from orchestrator.planning.speed_range import speed_range, sweep_bound
from orchestrator.spec.config import Config
from orchestrator.planning.forecast import history_of, trial_name
from orchestrator.spec.jobspec import JobSpec
from orchestrator.planning.speed_range import LoadModel, cores_for, load_model, loads_around
from orchestrator.model.states import JobState
from orchestrator.sweeps.spec import SweepSection
from tests.cost.test_cost_planning import PROBE, make_job, spec_of

CPU_BOUND = {**PROBE, "cpus": 2, "threads": 2, "cpu_per_wall": 2.0, "others_runnable": 0.0}


def test_cores_are_shared_fairly_among_runnable_tasks():
    assert cores_for(2, 2, 0) == 2.0 and cores_for(1, 2, 1) == 1.0
    assert cores_for(2, 2, 2) == pytest.approx(1.0)  # 2 of 4 runnable tasks on 2 cores
    assert cores_for(1, 2, 3) == pytest.approx(0.5)
    assert cores_for(8, 2, 0) == 2.0  # never more cores than the machine has


def test_a_cpu_bound_step_slows_with_its_share_and_a_gpu_bound_one_hardly():
    cpu = LoadModel(cpus=2, threads=2, busy=2.0, others=0.0)
    assert cpu.cpu_bound == 1.0 and cpu.factor(2.0) == pytest.approx(2.0)  # one core of two left
    gpu = LoadModel(cpus=2, threads=2, busy=0.2, others=0.0)  # a step mostly waiting on the GPU
    assert gpu.factor(2.0) == pytest.approx(0.9 + 0.1 * 2.0)
    # a probe that ran under load: the machine to itself is faster than what it measured
    busy = LoadModel(cpus=2, threads=2, busy=1.0, others=2.0)
    assert busy.factor(0.0) == pytest.approx(0.5) and busy.factor(2.0) == pytest.approx(1.0)
    assert load_model({**PROBE}) is None  # no load figures: no model (a fixed range instead)


def test_the_range_runs_from_the_quietest_to_the_busiest_recent_load_swung_and_a_neighbour():
    low, typical, high = loads_around(0.5, [3.0, 1.0, 0.2], 2)
    assert (low, typical, high) == (pytest.approx(0.2 / 1.5), 1.5, 3.0 * 1.5 + 1)
    assert loads_around(2.0, [0.5, 0.5, 0.1], 16)[1:] == (1.0, 2.0 * 1.5 + 4)  # one more per four cores
    assert loads_around(2.0, [], 2) == (pytest.approx(2.0 / 1.5), 2.0, 4.0)  # no load averages here
    assert loads_around(0.0, [0.0, 0.0, 0.0], 2) == (0.0, 0.0, 1.0)


def test_builtin_estimate_is_a_range_around_the_probe_under_the_typical_load():
    spec = spec_of(gpus=0, checkpoint={"every_n_steps": 300})
    idle = builtin_projection(spec, CPU_BOUND, 3.6, (3600.0, "t"), [0.0, 0.0, 0.0])
    # typical load = the probe's: the probe's own figures; the slow end with one busy neighbour
    assert idle["wall_s"] == pytest.approx(20 + 100 + 12 + 4 * 0.5 + 2, abs=0.1)
    # no quieter load than the probe's: the fast end is the run-to-run spread alone (±15 %)
    assert idle["wall_s_low"] == pytest.approx(idle["wall_s"] / 1.15, abs=0.1)
    # 2 threads beside one neighbour get 4/3 cores (1.5x slower); start-up and the end, on one
    # thread, still have a core of their own
    training = 100 * 2 / cores_for(2, 2, 1)
    assert idle["wall_s_high"] == pytest.approx(20 + training + (12 + 2) * 1.5 + 2, abs=0.2)
    assert idle["cost_high"] == pytest.approx(idle["wall_s_high"] / 3600 * 3.6, abs=1e-5)
    busy = builtin_projection(spec, CPU_BOUND, 3.6, (3600.0, "t"), [3.0, 3.0, 0.0])  # busier of late
    # busier of late: the typical run is slower, yet the quiet machine's time stays inside the range
    assert busy["wall_s"] > idle["wall_s"] and busy["wall_s_low"] == pytest.approx(idle["wall_s"], abs=0.1)
    assert busy["load"]["others_typical"] == 2.0 and busy["load"]["others_high"] == 5.5
    plain = builtin_projection(spec, PROBE, 3.6, (3600.0, "t"))  # no load figures: a fixed range
    assert plain["wall_s_low"] < plain["wall_s"] < plain["wall_s_high"] and plain["load"] is None


def _config(**daemon) -> Config:
    return Config.model_validate({"pricing": {"instance_hour": 3.6}, "daemon": daemon})


def _section(trials: int, parallel: int) -> SweepSection:
    return SweepSection.model_validate(
        {"job": "b.toml", "trials": trials, "parallel": parallel, "objective": "loss", "params": {"x": {"values": [1]}}}
    )


def test_a_sweeps_at_most_counts_each_wave_at_the_slow_end_with_its_trials_as_load():
    spec = spec_of(gpus=0, checkpoint={"every_n_steps": 300})
    data = builtin_projection(spec, CPU_BOUND, 3.6, (3600.0, "t"), [0.0, 0.0, 0.0])
    data.update(gpus=0, hourly_rate=3.6, _probe=CPU_BOUND)
    alone = sweep_bound(data, _section(4, 1), _config(cpu_slots=1))
    assert alone["trial_wall_s_at_most"] == pytest.approx(data["wall_s_high"], abs=0.2)
    assert alone["wall_s_at_most"] == pytest.approx(4 * (data["wall_s_high"] + 1.0), abs=1)
    assert alone["cost_at_most"] >= 4 * data["cost_high"] - 1e-6
    two = sweep_bound(data, _section(4, 2), _config(cpu_slots=2))
    # two trials of 2 threads each on 2 cores: each is slower than alone, the sweep is shorter
    assert two["trial_wall_s_at_most"] > alone["trial_wall_s_at_most"]
    expected = speed_range(CPU_BOUND, data["probed_parts_s"], [0.0, 0.0, 0.0], 2)["high"]
    assert two["trial_wall_s_at_most"] == pytest.approx(expected, abs=0.1)
    assert two["wall_s_at_most"] == pytest.approx(2 * (expected + 1.0), abs=1)
    assert two["cost_at_most"] == pytest.approx(two["wall_s_at_most"] / 3600 * 3.6, abs=1e-4)  # the instance


def test_a_command_sweep_is_estimated_from_its_trials_history():
    jobs = [
        make_job(id=1, name=trial_name("lr-scan", 0), run_seconds=100.0, cost=0.1),
        make_job(id=2, name=trial_name("lr-scan", 7), run_seconds=300.0, cost=0.3),
        make_job(id=3, name="lr-scan-t7-copy", run_seconds=9999.0),  # not a trial's name
        make_job(id=4, name=trial_name("other", 1), run_seconds=9999.0),
        make_job(id=5, name=trial_name("lr-scan", 2), run_seconds=9999.0, state=JobState.FAILED),
    ]
    assert history_of(jobs, "base") is None
    h = history_of(jobs, "base", sweep="lr-scan")
    assert h is not None and (h.runs, h.seconds, h.seconds_min, h.seconds_max) == (2, 200.0, 100.0, 300.0)
    spec = JobSpec.model_validate({"name": "base", "command": ["x"], "gpus": 0})
    d = command_projection(spec, h, 3.6, "lr-scan")
    assert (d["wall_s"], d["wall_s_low"], d["wall_s_high"]) == (200.0, 100.0, 300.0)
    assert "lr-scan" in d["basis"]
    d.update(gpus=0, hourly_rate=3.6)
    bound = sweep_bound(d, _section(3, 1), _config(cpu_slots=1))
    assert bound["trial_wall_s_at_most"] == 300.0 and bound["wall_s_at_most"] == 3 * 301.0


def test_with_early_stopping_the_low_end_is_its_earliest_stop():
    spec = spec_of(gpus=0, checkpoint={"every_n_steps": 300}, early_stopping={"monitor": "val_acc", "patience": 1})
    d = builtin_projection(spec, CPU_BOUND, 3.6, (3600.0, "t"), [0.0, 0.0, 0.0])
    # 3 evaluations, patience 1: it may stop after the second, 2/3 of the way
    assert d["wall_s_low"] == pytest.approx((20 + 2 + (100 + 12 + 2) * 2 / 3) / 1.15, abs=0.2)
    assert d["wall_s"] == pytest.approx(20 + 100 + 12 + 2 + 2, abs=0.1)  # the point: run to its end


def test_a_probe_whose_few_slow_batches_pulled_its_rate_down_has_a_faster_low_end():
    """A short probe on a cold machine: most batches at one pace, a few slow ones (page faults).
    The low end trains at the typical batch's pace; the estimate keeps the probe's rate."""
    from training.heartbeat.goodput import typical_share

    share = typical_share([0.01] * 8 + [0.05, 0.05])  # mean 0.018, median 0.01
    assert share == pytest.approx(0.01 / 0.018)
    assert typical_share([0.01] * 4) is None  # too few batches to tell
    assert typical_share([0.02, 0.01, 0.03, 0.02, 0.02]) == pytest.approx(1.0)  # median = mean: no pull
    spec = spec_of(gpus=0, checkpoint={"every_n_steps": 300})
    steady = builtin_projection(spec, CPU_BOUND, 3.6, (3600.0, "t"), [0.0, 0.0, 0.0])
    jumpy = builtin_projection(spec, {**CPU_BOUND, "typical_share": share}, 3.6, (3600.0, "t"), [0.0, 0.0, 0.0])
    assert jumpy["wall_s"] == steady["wall_s"] and jumpy["wall_s_high"] == steady["wall_s_high"]
    # 100 s of training at 0.56 of it: 44 s less, below the ±15 % floor the steady probe has
    assert jumpy["wall_s_low"] == pytest.approx(steady["wall_s"] - 100 * (1 - share), abs=0.1)
    assert jumpy["wall_s_low"] < steady["wall_s_low"]
    bogus = builtin_projection(spec, {**CPU_BOUND, "typical_share": "x"}, 3.6, (3600.0, "t"), [0.0, 0.0, 0.0])
    assert bogus["wall_s_low"] == steady["wall_s_low"]
