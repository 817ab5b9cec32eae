"""Sweeps of command jobs, end to end on real daemons, supervisors and processes: bad sweep files
(exit 2, file and field named, nothing stored), trials as jobs with their parameters, pruning
with a checkpoint and `orch retry` finishing a pruned trial, `orch sweep show --json`, cancel,
the sweep budget, a SIGKILLed daemon mid-sweep, and TPE's seeded proposals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import tomli_w
from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)
from sweep_harness import starts, write_score_job, write_sweep

from orchestrator.model.states import EventKind, JobState
from orchestrator.store import Store
from orchestrator.model.sweep_records import SweepState

SHOW_KEYS = {"id", "state", "objective", "direction", "best", "trials", "steps_total", "cost_total", "pruned", "saved"}
TRIAL_KEYS = {"id", "params", "state", "value", "steps", "cost"}


def _tick_until_done(h, d, sweep_id: int, timeout: float = 120.0):
    return h.tick_until(
        d, lambda: h.store.sweep(sweep_id).state is not SweepState.RUNNING, timeout, what=f"sweep {sweep_id} to end"
    )


def _submit(h, path: Path) -> int:
    out = h.cli("submit", str(path), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["kind"] == "sweep" and data["state"] == "running"
    return data["id"]


# -- bad sweep files -------------------------------------------------------------------------

BUILTIN_JOB = {
    "name": "b",
    "gpus": 0,
    "model": {"name_or_path": "bert-base-uncased"},
    "data": {"train": "imdb"},
    "train": {"max_steps": 10},
}


@pytest.mark.parametrize(
    "params, sweep, words",
    [
        ({"seed": {"values": [1, 2]}}, {}, ["sweep.params.seed:", "unknown job.toml path 'seed'", "train.seed"]),
        ({"train.batch_size": {"log_uniform": [8, 64]}}, {}, ["sweep.params.'train.batch_size'", "whole numbers"]),
        ({"train.learning_rate": {"values": [1e-3, -1.0]}}, {}, ["sweep.params.'train.learning_rate'", "-1.0"]),
        (
            {"train.learning_rate": {"values": [1e-3, 1e-4]}},
            {"sampler": "grid", "trials": 3},
            ["sweep.trials", "grid has 2 points", "trials = 3"],
        ),
        ({"train.learning_rate": {"uniform": [1e-3, 1e-2]}}, {"sampler": "grid"}, ["a grid needs values"]),
        ({"train.learning_rate": {"log_uniform": [0.0, 1e-2]}}, {}, ["sweep.params.'train.learning_rate'", "above 0"]),
        ({"train.learning_rate": {"values": [1e-3]}}, {"pruner": "hyperband"}, ["sweep.pruner"]),
        ({"train": {"values": [1]}}, {}, ["'train' is a table"]),
        (
            {"train.learning_rate": {"values": [1e-3]}},
            {"objective": "val_accuracy"},
            ["sweep.objective", "'val_accuracy'", "val_acc"],
        ),
    ],
)
def test_a_bad_sweep_file_exits_2_naming_file_and_field_and_stores_nothing(tmp_path, home, cli, params, sweep, words):
    (tmp_path / "job.toml").write_text(tomli_w.dumps(BUILTIN_JOB))
    path = write_sweep(tmp_path, params=params, **sweep)
    out = cli("submit", path)
    assert out.rc == 2, out.out + out.err
    assert "Traceback" not in out.err and str(path) in out.err
    for word in words:
        assert word in out.err, out.err
    assert Store(home / "orch.db").sweeps() == []


def test_the_sweep_files_problems_and_its_base_jobs_come_in_one_report(tmp_path, home, cli):
    # They came in stages: fix the sweep table, submit again, only then hear about the job file.
    (tmp_path / "job.toml").write_text(tomli_w.dumps({**BUILTIN_JOB, "train": {"max_steps": 0}}))
    path = write_sweep(tmp_path, params={"train.learning_rate": {"values": [1e-3]}}, trials=0)
    out = cli("submit", path)
    assert out.rc == 2 and "Traceback" not in out.err, out.err
    assert f"{path}: sweep.trials: must be greater than 0" in out.err, out.err
    assert "job.toml: train.max_steps: must be greater than 0" in out.err, out.err
    assert Store(home / "orch.db").sweeps() == []


def test_a_command_sweep_placeholder_without_a_parameter_is_refused(tmp_path, home, cli):
    write_score_job(tmp_path)
    path = write_sweep(tmp_path, params={"y": {"uniform": [0.0, 1.0]}})
    out = cli("submit", path)
    assert out.rc == 2
    assert "uses {x} but no parameter is named 'x'" in out.err


def test_submit_flags_for_a_single_job_are_refused_for_a_sweep_and_priority_reaches_its_trials(tmp_path, home, cli):
    write_score_job(tmp_path)
    path = write_sweep(tmp_path)
    out = cli("submit", path, "--after", "1", "--at", "+1h")
    assert out.rc == 2 and "--after, --at are for a single job" in out.err
    assert Store(home / "orch.db").sweeps() == []
    out = cli("submit", path, "--priority", "7", "--json")
    assert out.rc == 0, out.err
    assert Store(home / "orch.db").sweep(json.loads(out.out)["id"]).spec["job"]["priority"] == 7


# -- the outcome table's prune row ---------------------------------------------------------------


@pytest.mark.parametrize(
    "code, sig, has_result, state",
    [
        (0, None, True, JobState.SUCCEEDED),  # it finished before the signal landed
        (0, None, False, JobState.PRUNED),
        (75, None, False, JobState.PRUNED),  # checkpointed on SIGTERM: the usual way a trial is pruned
        (76, None, False, JobState.PRUNED),
        (None, 9, False, JobState.PRUNED),
        (1, None, False, JobState.PRUNED),
    ],
)
def test_a_prune_intent_decides_pruned_whatever_the_exit_unless_the_job_finished(code, sig, has_result, state):
    from orchestrator.jobs.outcome import Exit, Retries, decide
    from orchestrator.model.states import Intent
    from orchestrator.reports.run_report import RunReport

    d = decide(Intent.PRUNE, Exit(code, sig), RunReport(has_result=has_result), is_command=False, retries=Retries(0, 2))
    assert d.state is state and not d.charged
    assert d.event is (EventKind.SUCCEEDED if state is JobState.SUCCEEDED else EventKind.PRUNED)


# -- a command-job sweep end to end --------------------------------------------------------------


def test_a_command_job_sweep_runs_its_trials_as_jobs_and_reports_the_best(orch_home):
    h = orch_home(cpu_slots=2)
    h.configure({"notifiers": [{"type": "webhook", "name": "hook", "url": "http://127.0.0.1:9/unused"}]}, cpu_slots=2)
    write_score_job(h.tmp)
    sweep_id = _submit(h, write_sweep(h.tmp, trials=5, parallel=2, sampler="random", seed=4))
    d = h.local_daemon()
    _tick_until_done(h, d, sweep_id)

    trials = h.store.trials(sweep_id)
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert len({t.job_id for t in trials}) == 5
    ran = starts(h.tmp)
    for t in trials:  # the parameter reached the job as a placeholder and as ORCH_PARAM_X, once
        mine = [r for r in ran if r["job"] == t.job_id]
        assert len(mine) == 1
        assert mine[0]["x_arg"] == pytest.approx(t.params["x"]) and float(mine[0]["x_env"]) == pytest.approx(
            t.params["x"]
        )
        assert h.state(t.job_id) is JobState.SUCCEEDED

    shown = h.cli_json("sweep", "show", str(sweep_id))
    assert SHOW_KEYS <= set(shown) and shown["state"] == "succeeded"
    assert all(TRIAL_KEYS <= set(t) for t in shown["trials"])
    values = [t["value"] for t in shown["trials"]]
    assert values == sorted(values, reverse=True)  # best first
    best_x = max(trials, key=lambda t: 1 - (t.params["x"] - 0.3) ** 2).params
    assert shown["best"]["params"] == best_x and shown["best"]["value"] == pytest.approx(values[0])
    assert shown["steps_total"] == 5 * 8
    ends = h.store.events(None, kinds=[EventKind.SWEEP_FINISHED.value])
    assert len(ends) == 1 and f"sweep {sweep_id}" in ends[0].detail and "best trial" in ends[0].detail
    messages = [row.payload for row in h.store.outbox()]
    finished = [m for m in messages if m["event"] == "sweep_finished"]  # a default event of every channel
    assert len(finished) == 1 and "best trial" in finished[0]["reason"] and "x=" in finished[0]["reason"]

    text = h.cli("status", "--all").stdout
    assert f"sweep {sweep_id} (sweep): succeeded, 5 of 5 trials" in text
    assert {r["sweep"] for r in h.cli_json("status", "--all")} == {sweep_id}


def test_the_median_pruner_stops_a_losing_trial_with_a_checkpoint_and_retry_finishes_it(orch_home):
    h = orch_home(cpu_slots=1)
    h.configure({"pricing": {"instance_hour": 36.0, "currency": "USD"}}, cpu_slots=1)
    write_score_job(h.tmp, steps=30, pause=0.1)
    # Grid seed 1 tries x = 0.3 (the best) first; the two after it fall behind it from the first step.
    sweep_id = _submit(
        h,
        write_sweep(
            h.tmp,
            trials=3,
            parallel=1,
            sampler="grid",
            seed=1,
            pruner="median",
            prune_after_steps=5,
            prune_startup_trials=1,
            params={"x": {"values": [0.3, 0.9, 0.6]}},
        ),
    )
    d = h.local_daemon()
    _tick_until_done(h, d, sweep_id, timeout=180)
    shown = h.cli_json("sweep", "show", str(sweep_id))
    by_x = {t["params"]["x"]: t for t in shown["trials"]}
    assert by_x[0.3]["state"] == "succeeded" and by_x[0.3]["steps"] == 30
    pruned = [by_x[0.9], by_x[0.6]]
    assert [t["state"] for t in pruned] == ["pruned", "pruned"]
    assert all(5 <= t["steps"] < 30 for t in pruned)
    assert shown["pruned"] == 2 and shown["saved"] > 0
    assert shown["steps_total"] < 3 * 30
    job = h.store.get(by_x[0.9]["id"])
    assert "pruned by the sweep's median pruner" in job.reason
    notice = sorted((h.run_dir(job.id) / "checkpoints").glob("notice-step-*.ckpt"))
    assert notice, "a pruned trial stops with a checkpoint"
    assert h.store.attempts(job.id)[-1].outcome.value == "pruned"

    out = h.cli("retry", str(job.id))
    assert out.returncode == 0, out.stderr
    h.tick_until(d, lambda: h.state(job.id).is_terminal, 60, what="the retried trial to end")
    assert h.state(job.id) is JobState.SUCCEEDED
    second = [r for r in starts(h.tmp) if r["job"] == job.id and r["attempt"] == 2]
    assert second and second[0]["from"] == int(notice[-1].read_text())  # resumed where it was pruned


def test_sweep_cancel_cancels_queued_and_running_trials_and_ends_the_sweep(orch_home):
    h = orch_home(cpu_slots=1)
    write_score_job(h.tmp, steps=400, pause=0.05)
    sweep_id = _submit(h, write_sweep(h.tmp, trials=6, parallel=2))
    d = h.local_daemon()
    h.tick_until(
        d,
        lambda: any(h.state(t.job_id) is JobState.RUNNING for t in h.store.trials(sweep_id)),
        30,
        what="a running trial",
    )
    out = h.cli("sweep", "cancel", str(sweep_id))
    assert out.returncode == 0 and "cancelling sweep" in out.stdout, out.stderr
    _tick_until_done(h, d, sweep_id, timeout=60)
    assert h.store.sweep(sweep_id).state is SweepState.CANCELLED
    trials = h.store.trials(sweep_id)
    assert len(trials) == 2  # no trial created after the cancel
    assert {h.state(t.job_id) for t in trials} == {JobState.CANCELLED}
    again = h.cli("sweep", "cancel", str(sweep_id))
    assert again.returncode == 1 and "already cancelled" in again.stderr


def test_the_sweep_budget_stops_its_trials_and_the_sweep(orch_home):
    h = orch_home(cpu_slots=2)
    h.configure({"pricing": {"instance_hour": 360.0, "currency": "USD"}}, cpu_slots=2)  # 0.1 a second
    write_score_job(h.tmp, steps=400, pause=0.05)
    sweep_id = _submit(h, write_sweep(h.tmp, trials=6, parallel=2, max_cost=0.3))
    d = h.local_daemon()
    _tick_until_done(h, d, sweep_id, timeout=90)
    sweep = h.store.sweep(sweep_id)
    assert sweep.state is SweepState.STOPPED and "budget" in sweep.reason
    trials = h.store.trials(sweep_id)
    assert len(trials) < 6
    assert {h.state(t.job_id) for t in trials} <= {JobState.STOPPED, JobState.CANCELLED}


# -- restarts ---------------------------------------------------------------------------------


def test_a_daemon_sigkilled_mid_sweep_and_restarted_runs_exactly_trials_trials_none_twice(orch_home):
    h = orch_home(cpu_slots=2)
    write_score_job(h.tmp, steps=10, pause=0.1)
    sweep_id = _submit(h, write_sweep(h.tmp, trials=6, parallel=2, sampler="random", seed=2))
    daemon = h.start_daemon()
    wait_for(lambda: len(h.store.trials(sweep_id)) >= 3, 90, what="the third trial")
    h.kill9(daemon)
    h.start_daemon()
    wait_for(lambda: h.store.sweep(sweep_id).state is not SweepState.RUNNING, 180, what="the sweep to end")
    trials = h.store.trials(sweep_id)
    assert [t.number for t in trials] == list(range(6))
    assert len({json.dumps(t.params) for t in trials}) == 6
    assert all(h.state(t.job_id) is JobState.SUCCEEDED for t in trials)
    first_starts = [r for r in starts(h.tmp) if r["attempt"] == 1]
    assert sorted(r["job"] for r in first_starts) == sorted(t.job_id for t in trials)  # each job started once
    assert len(_optuna_trials(h, sweep_id)) == 6


def test_an_optuna_trial_asked_before_a_crash_is_run_by_the_next_daemon_not_asked_again(orch_home):
    """The daemon died between Optuna's ask and the trial's job insert: the asked trial is given its job."""
    h = orch_home(cpu_slots=2)
    write_score_job(h.tmp, steps=3, pause=0.01)
    sweep_id = _submit(h, write_sweep(h.tmp, trials=3, parallel=2, sampler="random", seed=9))
    from orchestrator.sweeps.spec import SweepSection
    from orchestrator.sweeps.study import SweepStudy

    study = SweepStudy(h.root, sweep_id, SweepSection.model_validate(h.store.sweep(sweep_id).spec["sweep"]))
    number, params = study.ask()  # ... and the process is gone before the insert
    d = h.local_daemon()
    _tick_until_done(h, d, sweep_id)
    trials = h.store.trials(sweep_id)
    assert [t.number for t in trials] == [0, 1, 2]
    assert trials[0].number == number and trials[0].params == params
    assert len(_optuna_trials(h, sweep_id)) == 3


def _optuna_trials(h, sweep_id: int) -> list:
    from orchestrator.sweeps.spec import SweepSection
    from orchestrator.sweeps.study import SweepStudy

    study = SweepStudy(h.root, sweep_id, SweepSection.model_validate(h.store.sweep(sweep_id).spec["sweep"]))
    return [t for t in study.trials().values()]


# -- samplers ---------------------------------------------------------------------------------


def test_tpe_with_a_fixed_seed_proposes_the_same_parameters_on_a_rerun(tmp_path, orch_home):
    proposals = []
    for _ in range(2):
        h = orch_home(cpu_slots=1)
        write_score_job(h.tmp, steps=2, pause=0.0)
        # 12 trials: Optuna's TPE proposes at random for its first 10, then from the model it fitted.
        sweep_id = _submit(
            h,
            write_sweep(
                h.tmp,
                trials=12,
                parallel=1,
                sampler="tpe",
                seed=5,
                params={"x": {"uniform": [0.0, 1.0]}, "y": {"int": [1, 4]}},
            ),
        )
        d = h.local_daemon()
        _tick_until_done(h, d, sweep_id, timeout=240)
        proposals.append([t.params for t in h.store.trials(sweep_id)])
    assert len(proposals[0]) == 12
    assert proposals[0] == proposals[1]


DAEMON_PROBE = r"""
import sys
from orchestrator.spec.config import load_config
from orchestrator.daemon.tick import Daemon
from orchestrator.home.paths import Home
from orchestrator.host.polling import poll
from orchestrator.store import Store

from pathlib import Path
home = Home(Path(sys.argv[1])); store = Store(home.db); job_id = int(sys.argv[2])
d = Daemon(home, load_config(home.root / "config.toml"), store, gpu_ids=[])
poll(lambda: d.tick() or store.get(job_id).state.is_terminal, 60, 0.1)
print("optuna" in sys.modules, store.get(job_id).state.value, flush=True)
sys.stdin.readline()
d.tick()
print("optuna" in sys.modules, len(store.trials(1)), flush=True)
"""


def test_the_daemon_imports_optuna_only_while_a_sweep_exists(orch_home):
    import subprocess

    h = orch_home(cpu_slots=1)
    job_id = h.submit("plain")
    write_score_job(h.tmp, steps=2, pause=0.0)
    sweep = write_sweep(h.tmp, trials=1, parallel=1)
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON_PROBE, str(h.root), str(job_id)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=h.env(),
    )
    first = proc.stdout.readline().split()
    if first != ["False", "succeeded"]:
        proc.kill()
        raise AssertionError(f"{first}: {proc.communicate()[1]}")
    assert _submit(h, sweep) == 1
    out, errs = proc.communicate("go\n", timeout=60)
    assert out.split() == ["True", "1"], errs


def test_a_successive_halving_sweep_prunes_against_its_rungs_and_ends(orch_home):
    h = orch_home(cpu_slots=1)
    write_score_job(h.tmp, steps=12, pause=0.05)
    sweep_id = _submit(
        h,
        write_sweep(
            h.tmp,
            trials=4,
            parallel=1,
            sampler="grid",
            seed=4,
            pruner="halving",
            prune_after_steps=2,
            params={"x": {"values": [0.3, 0.6, 0.9, 0.0]}},
        ),
    )
    d = h.local_daemon()
    _tick_until_done(h, d, sweep_id, timeout=120)
    shown = h.cli_json("sweep", "show", str(sweep_id))
    assert shown["state"] == "succeeded" and len(shown["trials"]) == 4
    assert shown["best"]["params"] == {"x": 0.3}  # tried first (grid seed 4), never pruned
    assert shown["pruned"] >= 1 and shown["steps_total"] < 4 * 12
