"""The estimate's maths (planning/projection.py) driven by a probe recorded on this machine
(tests/recorded/probe-tiny-bert.json: a real `python -m training.probe` of a tiny BERT, taken
under load), with no training in the test: the parts add up, the range holds the estimate, a
quieter machine than the probe's makes training shorter, cost follows the rate, early stopping
lowers only the low end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.planning.projection import builtin_projection, checkpoint_plan, earliest_stop_share
from orchestrator.spec.jobspec import JobSpec

PROBE = json.loads((Path(__file__).parents[1] / "recorded" / "probe-tiny-bert.json").read_text())
RATE = 3.6  # per hour: a second costs 0.001
MTBF = (10 * 3600.0, "test")


def spec(**kw) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "tiny",
            "gpus": 0,
            "model": {"name_or_path": "m", "num_labels": 2},
            "data": {"train": "t.jsonl", "validation": "d.jsonl", "max_length": 32},
            "train": {"max_epochs": 2, "batch_size": 16, "precision": "32"},
            "checkpoint": {"every_n_steps": 25},
            **kw,
        }
    )


def test_the_recorded_probe_projects_parts_that_add_up_inside_their_range():
    d = builtin_projection(spec(), PROBE, RATE, MTBF, [0.5, 0.5, 0.5])
    assert d["total_steps"] == PROBE["total_steps"] == 40
    assert sum(d["parts_s"].values()) == pytest.approx(d["wall_s"], abs=0.5)
    assert d["wall_s_low"] <= d["wall_s"] <= d["wall_s_high"]
    assert d["cost"] == pytest.approx(d["wall_s"] / 3600 * RATE, rel=1e-3)
    assert d["cost_low"] <= d["cost"] <= d["cost_high"]
    # 40 steps at the probed rate, a save every 25 steps: one periodic save and the final one
    interval, why = checkpoint_plan(spec(), PROBE["steps_per_s"], PROBE["checkpoint_s"], MTBF[0])
    assert interval == pytest.approx(25 / PROBE["steps_per_s"]) and "every_n_steps = 25" in why
    assert d["saves"] == 2 and d["checkpoint_interval_s"] == pytest.approx(interval, abs=0.05)
    assert d["probe"]["seconds"] == pytest.approx(PROBE["probe_s"], abs=0.1)
    assert d["gpu_hours"] == 0.0  # gpus = 0


def test_a_quieter_machine_than_the_probes_trains_faster_than_measured():
    # the probe ran beside ~15 runnable tasks; this machine's recent load is far lower
    quiet = builtin_projection(spec(), PROBE, RATE, MTBF, [0.2, 0.2, 0.2])
    assert quiet["parts_s"]["training"] < quiet["probed_parts_s"]["training"]
    busy = builtin_projection(spec(), PROBE, RATE, MTBF, [20.0, 20.0, 20.0])
    assert busy["wall_s"] > quiet["wall_s"]


def test_early_stopping_lowers_only_the_low_end():
    plain = builtin_projection(spec(), PROBE, RATE, MTBF, [0.5, 0.5, 0.5])
    stopping = spec(early_stopping={"monitor": "val_acc", "mode": "max", "patience": 0})
    assert earliest_stop_share(stopping, PROBE, PROBE["evals"]) == pytest.approx(0.5)  # 1 of 2 evaluations
    early = builtin_projection(stopping, PROBE, RATE, MTBF, [0.5, 0.5, 0.5])
    assert early["wall_s"] == pytest.approx(plain["wall_s"]) and early["wall_s_high"] == pytest.approx(
        plain["wall_s_high"]
    )
    assert early["wall_s_low"] < plain["wall_s_low"]
    assert early["early_stopping"] is True
