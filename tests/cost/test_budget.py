"""Budgets through a real daemon: a job's [budget] max_cost / max_hours and config [budget] total
stop running jobs with SIGTERM (they checkpoint) into `stopped`, the notification says what was
spent, queued jobs are held while the total is spent, and `orch retry ID --budget BIG` resumes
a built-in job from its checkpoint to the same step count as an uninterrupted run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cost_helpers import WebhookReceiver, orch_factory, wait_for
from orchestrator.model.states import JobState

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_orch(tmp_path):
    yield from orch_factory(tmp_path)


@pytest.fixture
def webhook():
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


def test_total_budget_stops_the_running_job_and_holds_the_queue(make_orch, webhook):
    # 0.1 per second of uptime, 30 in all. The spend is brought to 0.2 short of the total only once the
    # job has set its SIGTERM handler (its progress.json): on a busy machine a Python start-up takes
    # seconds, and a budget that tripped before it would kill a job that never could checkpoint.
    o = make_orch(
        {
            "pricing": {"currency": "CNY", "instance_hour": 360.0},
            "budget": {"total": 30.0},
            "notifiers": [{"type": "webhook", "url": webhook.url, "events": ["stopped"]}],
        }
    )
    first = o.submit(o.command_job("first", sleep=120, notice_ckpt=7, step=1))
    daemon = o.start_daemon()
    wait_for((o.home.run_dir(first) / "progress.json").exists, 60, "the job to set its SIGTERM handler")
    assert o.job(first).state is JobState.RUNNING
    spent = o.store.total_cost()
    assert spent < 29.8, spent  # not yet crossed: the stop below is the accrual's doing
    # what was spent before, as idle time in the ledger; the daemon's accrual adds to it
    o.store.db.execute(
        "INSERT INTO ledger(key, value) VALUES('idle_cost', ?) ON CONFLICT(key) DO UPDATE SET value=value+excluded.value",
        (29.8 - spent,),
    )
    o.store.db.commit()
    job = o.wait_state(first, JobState.STOPPED)
    assert job.reason.startswith("budget: spent") and "[budget] total is 30.00" in job.reason
    assert (o.home.run_dir(first) / "checkpoints" / "notice-step-00000007.ckpt").exists()
    assert o.store.attempts(first)[-1].exit_code == 75  # it checkpointed on SIGTERM, not killed

    second = o.submit(o.command_job("second", sleep=0))
    wait_for(
        lambda: o.job(second).reason.startswith("held: the total budget"),
        10,
        "the queued job to be held for the budget",
    )
    [row] = [r for r in o.cli_json("status") if r["id"] == second]
    assert row["state"] == "queued" and row["reason"].startswith("held: the total budget of 30.00")
    assert "held: the total budget" in o.cli("status").stdout  # the NOTE column
    assert o.job(second).attempt == 0  # held, never started

    # The notification says what was spent.
    msg = wait_for(lambda: [m for m in webhook.received if m["event"] == "stopped"], 15, "the stopped message")[0]
    assert msg["message"]["job_id"] == first and "spent" in msg["message"]["reason"]
    assert msg["message"]["cost"] > 0
    assert o.stop_daemon(daemon) == 0


def test_max_hours_stops_a_job_with_its_reason_and_event(make_orch):
    o = make_orch({"pricing": {"instance_hour": 1.0}})
    job_id = o.submit(o.command_job("long", sleep=60, notice_ckpt=3, budget={"max_hours": 1.5 / 3600}))
    daemon = o.start_daemon()
    job = o.wait_state(job_id, JobState.STOPPED)
    assert job.reason.startswith("budget: ran") and "max_hours" in job.reason
    assert job.run_seconds >= 1.5
    shown = o.cli_json("show", str(job_id))
    assert shown["state"] == "stopped"
    stopped = [e for e in shown["events"] if e["kind"] == "stopped"]
    assert stopped and "max_hours" in stopped[0]["detail"]
    assert o.stop_daemon(daemon) == 0


# -- a real built-in job ------------------------------------------------------------------------

EPOCHS, ROWS, BATCH = 4, 640, 16
STEPS = EPOCHS * (ROWS // BATCH)


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory) -> Path:
    sys.path.insert(0, str(REPO))
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    folder = tmp_path_factory.mktemp("assets")
    write_jsonl(folder / "train.jsonl", sentiment_rows(ROWS, seed=11))
    write_jsonl(folder / "dev.jsonl", sentiment_rows(64, seed=12))
    build_tiny_bert(
        folder / "tiny-bert",
        [r["text"] for r in sentiment_rows(2000, seed=1)],
        hidden=32,
        layers=2,
        heads=2,
        vocab_size=300,
        max_positions=64,
    )
    return folder


def _builtin_job(folder: Path, assets: Path, max_cost: float) -> Path:
    import tomli_w

    spec = {
        "name": "budgeted",
        "gpus": 0,
        "retries": 0,
        "model": {"name_or_path": str(assets / "tiny-bert"), "num_labels": 2},
        "data": {
            "train": str(assets / "train.jsonl"),
            "validation": str(assets / "dev.jsonl"),
            "max_length": 32,
            "num_workers": 0,
        },
        "train": {"max_epochs": EPOCHS, "batch_size": BATCH, "precision": "32", "learning_rate": 1e-3, "seed": 7},
        "checkpoint": {"every_n_steps": 20, "keep": 2},
        "budget": {"max_cost": max_cost},
        # 160 steps take ~3 s on an idle CPU: slow each step so the budget trips mid-training.
        "env": {"ORCH_FAULT_SLOW_STEP_S": "0.1"},
    }
    path = folder / "budgeted.toml"
    path.write_text(tomli_w.dumps(spec))
    return path


@pytest.mark.slow
def test_max_cost_stops_a_builtin_job_and_retry_with_a_bigger_budget_finishes_it(make_orch, tiny_assets, tmp_path):
    """0.1 per second of running. Start-up (imports, tokenization) takes 3-15 s on a busy CPU, so a
    fixed small budget could trip before the first step; instead, once training is under way,
    the job's max_cost is set (in the real store, as `retry --budget` does) to what it has spent
    plus 0.2: the accrual crosses it about 2 s later."""
    o = make_orch({"pricing": {"currency": "CNY", "instance_hour": 360.0}})
    daemon = o.start_daemon()
    job_id = o.submit(_builtin_job(tmp_path, tiny_assets, max_cost=1000.0))

    # While it runs: ETA and projected cost from its progress.json, in status and show.
    from orchestrator.views.jobs import status_rows

    def projected_row():
        rows = [r for r in status_rows(o.store, o.home, 0.0) if r["id"] == job_id and r["state"] == "running"]
        return rows[0] if rows and rows[0]["projected_cost"] is not None and rows[0]["step"] >= 25 else None

    row = wait_for(projected_row, 90, "a running row past step 25 with an ETA and a projected cost", interval=0.25)
    assert row["eta_s"] > 0 and row["projected_cost"] >= row["cost"] and row["projection_is_upper_bound"] is False
    shown = o.cli_json("show", str(job_id))
    assert shown["state"] == "running" and shown["projected_cost"] is not None
    limit = round(o.job(job_id).cost + 0.2, 2)
    o.store.update(job_id, 0.0, max_cost=limit)

    job = o.wait_state(job_id, JobState.STOPPED, timeout=90)
    assert job.reason.startswith("budget: spent") and f"max_cost {limit:.2f}" in job.reason
    notice = sorted((o.home.run_dir(job_id) / "checkpoints").glob("notice-step-*.ckpt"))
    assert notice, f"no notice checkpoint; log:\n{(o.home.run_dir(job_id) / 'attempt-1.log').read_text()[-2000:]}"
    stopped_at = int(notice[-1].stem.rsplit("-", 1)[1])
    assert 0 < stopped_at < STEPS
    assert o.store.attempts(job_id)[0].exit_code == 75
    spent = job.cost

    out = o.cli("retry", str(job_id), "--budget", "1000")
    assert out.returncode == 0, out.stderr
    job = o.wait_state(job_id, JobState.SUCCEEDED, timeout=120)
    a1, a2 = o.store.attempts(job_id)
    assert a2.resumed_from_step == stopped_at > 0
    result = json.loads((o.home.run_dir(job_id) / "result.json").read_text())
    assert result["steps"] == STEPS  # the same count as an uninterrupted run
    assert job.max_cost == 1000 and job.cost > spent  # the cost went on from where it was
    assert job.attempt == 2 and job.steps_lost == 0  # resumed from the notice checkpoint: nothing redone
    assert o.stop_daemon(daemon) == 0
