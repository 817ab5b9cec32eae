"""One tracker run per job, with the real libraries: W&B offline, SwanLab offline (local files),
MLflow on a file store. A built-in job stopped by SIGTERM (exit 75) mid-training and resumed ends
with one run per tracker, finished, its steps strictly increasing and the resume marked; a command
job that fails once sees the same run ids on its retry and continues one MLflow run; an MLflow
server that is not there leaves a built-in job's outcome as it was."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import wait_for
from tracker_files import swanlab_attempts, wandb_attempts
from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

pytestmark = pytest.mark.slow
ORCH = [sys.executable, "-m", "orchestrator.cli"]
pytest.importorskip("wandb")
pytest.importorskip("swanlab")
pytest.importorskip("mlflow")


def env_for(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "SWANLAB_", "MLFLOW_"))}
    env.update(
        ORCH_HOME=str(home),
        HF_HUB_OFFLINE="1",
        WANDB_SILENT="true",
        MLFLOW_ALLOW_FILE_STORE="true",
        ORCH_FAULT_SLOW_STEP_S="0.1",  # a window to signal in
        ORCH_PROGRESS_EVERY_S="0.2",
    )
    return env


def orch(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*ORCH, *args], capture_output=True, text=True, timeout=timeout, env=env_for(home))


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tracked")
    rows = sentiment_rows(480, seed=5)
    write_jsonl(folder / "train.jsonl", rows[:400])
    write_jsonl(folder / "dev.jsonl", rows[400:])
    build_tiny_bert(
        folder / "bert", [r["text"] for r in rows], hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64
    )
    return folder


def builtin_job(folder: Path, name: str, max_steps: int, tracking: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(
        f"""
name = "{name}"
gpus = 0
[model]
name_or_path = "./bert"
[data]
train = "./train.jsonl"
validation = "./dev.jsonl"
max_length = 32
num_workers = 0
[train]
max_epochs = 50
max_steps = {max_steps}
batch_size = 16
precision = "32"
learning_rate = 1e-3
val_check_interval = 20
[checkpoint]
every_n_steps = 1000
[tracking]
{tracking}
"""
    )
    return path


@pytest.fixture(scope="module")
def preempted_and_resumed(workload, tmp_path_factory) -> dict[str, Any]:
    """The module's one reference run: a built-in job logging to all three trackers, stopped at
    step 12 or later by SIGTERM (exit 75), then resumed to its end (40 steps)."""
    home = tmp_path_factory.mktemp("home")
    job = builtin_job(workload, "tracked", 40, 'backends = ["wandb", "swanlab", "mlflow"]\nmode = "offline"')
    proc = subprocess.Popen(
        [*ORCH, "run", str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(home)
    )
    progress = home / "runs" / "1" / "progress.json"

    def step() -> int:
        try:
            return json.loads(progress.read_text()).get("step", 0)
        except (OSError, ValueError):
            return 0

    try:
        wait_for(lambda: step() >= 12, 240, "training to reach step 12")
        proc.send_signal(signal.SIGINT)  # `orch run` passes it on to the job as SIGTERM
        _, first_err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, first_err[-3000:]
    second = orch(home, "run", "--resume", "1")
    assert second.returncode == 0, second.stderr[-3000:]
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    run_dir = home / "runs" / "1"
    return {
        "home": home,
        "run_dir": run_dir,
        "shown": shown,
        "resumed_at": shown["attempts"][1]["resumed_from_step"],
        "tracking": json.loads((run_dir / "tracking.json").read_text()),
        "logs": first_err + second.stderr,
    }


def test_the_job_ran_twice_and_every_tracker_logged_without_a_warning(preempted_and_resumed):
    ran = preempted_and_resumed
    assert ran["shown"]["state"] == "succeeded" and ran["shown"]["result"]["steps"] == 40
    assert 12 <= ran["resumed_at"] < 40
    backends = ran["tracking"]["backends"]
    assert set(backends) == {"wandb", "swanlab", "mlflow"}
    assert all(not b.get("warning") for b in backends.values()), backends
    assert "is not logging" not in ran["logs"]
    text = orch(ran["home"], "show", "1").stdout
    assert f"tracker:   wandb run {backends['wandb']['run_id']}  tracked  offline" in text


def test_wandb_one_run_paused_then_finished_steps_rising_resume_marked(preempted_and_resumed):
    ran = preempted_and_resumed
    attempts = wandb_attempts(ran["run_dir"] / "trackers" / "wandb")
    assert len(attempts) == 2  # an offline folder per attempt, one run id: `wandb sync` makes one run
    uid = ran["tracking"]["uid"]
    assert [a["run_id"] for a in attempts] == [uid, uid]
    assert attempts[0]["preempting"] and attempts[0]["exit"] == 75  # shown as preempted, not finished
    assert attempts[1]["exit"] == 0
    steps = [r["_step"] for a in attempts for r in a["rows"]]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
    loss_steps = [r["trainer/global_step"] for a in attempts for r in a["rows"] if "train_loss" in r]
    assert loss_steps == sorted(set(loss_steps)) and loss_steps[-1] == 39
    assert any(r.get("orch/resumed_at_step") == ran["resumed_at"] for r in attempts[1]["rows"])
    assert f"resumed at step {ran['resumed_at']} from notice-step-" in attempts[1]["notes"]
    assert any("samples_per_s" in r and "lr" in r for r in attempts[1]["rows"])  # throughput


def test_swanlab_one_run_aborted_then_finished_steps_rising_resume_marked(preempted_and_resumed):
    from swanlab.proto.swanlab.run.v1.run_pb2 import RunState

    ran = preempted_and_resumed
    attempts = swanlab_attempts(ran["run_dir"] / "trackers" / "swanlog")
    uid = ran["tracking"]["uid"]
    assert [a["run_id"] for a in attempts] == [uid, uid]
    assert [a["finish"] for a in attempts] == [RunState.RUN_STATE_ABORTED, RunState.RUN_STATE_FINISHED]
    loss = [s for a in attempts for s in a["steps"].get("train_loss", [])]
    assert loss == sorted(set(loss)) and loss[-1] == 39
    assert attempts[1]["steps"]["orch/resumed_at_step"] == [ran["resumed_at"]]


def test_mlflow_one_run_finished_steps_rising_resume_tagged_model_path(preempted_and_resumed):
    from mlflow.tracking import MlflowClient

    ran = preempted_and_resumed
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((ran["run_dir"] / "trackers" / "mlruns").as_uri())
    exp = client.get_experiment_by_name("tracked")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == ran["tracking"]["backends"]["mlflow"]["run_id"]
    assert run.info.status == "FINISHED"
    assert run.data.tags["orch.job_uid"] == ran["tracking"]["uid"]
    assert run.data.tags["orch.resume.attempt-2"].startswith(f"resumed at step {ran['resumed_at']} from notice-step-")
    assert run.data.tags["orch.final.model_path"] == str(ran["run_dir"] / "model")
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert steps == sorted(set(steps)) and steps[-1] == 39
    assert run.data.params["batch_size"] == "16"


RETRIED_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import mlflow, torch
    from training.torch_loop import OrchLoop

    with open(os.path.join(os.environ["ORCH_RUN_DIR"], "ids.jsonl"), "a") as fh:
        names = ("ORCH_JOB_UID", "WANDB_RUN_ID", "WANDB_RESUME", "SWANLAB_RUN_ID", "SWANLAB_RESUME", "MLFLOW_RUN_ID")
        fh.write(json.dumps({k: os.environ.get(k) for k in names}) + "\\n")
    model = torch.nn.Linear(1, 1)
    loop = OrchLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), total_steps=4)
    with mlflow.start_run():  # MLFLOW_RUN_ID, when orch gives it, continues the run
        start = loop.resume() and loop.step or 0
        for step in range(loop.step, 4):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
            loop.step_done()
            if os.environ["ORCH_ATTEMPT"] == "1" and step == 1:
                sys.exit(3)  # a crash: retried with resume
        loop.finish()
    """
)


def test_a_command_job_failing_once_sees_the_same_ids_and_continues_one_mlflow_run(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[daemon]\nretry_backoff_seconds = 0\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(RETRIED_SCRIPT)
    store = tmp_path / "mlruns"
    repo = Path(__file__).resolve().parents[2]
    (work / "job.toml").write_text(
        f"""
name = "cmd-tracked"
gpus = 0
retries = 1
command = ["{sys.executable}", "train.py"]
[env]
PYTHONPATH = "{repo}"
[tracking]
backends = ["mlflow", "wandb"]
mode = "offline"
mlflow_uri = "{store.as_uri()}"
"""
    )
    res = orch(home, "run", str(work / "job.toml"))
    assert res.returncode == 0, res.stderr[-3000:]
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    assert [a["outcome"] for a in shown["attempts"]][-1] == "succeeded" and len(shown["attempts"]) == 2
    ids = [json.loads(line) for line in (home / "runs" / "1" / "ids.jsonl").read_text().splitlines()]
    first, second = ids
    assert first["ORCH_JOB_UID"] and first["WANDB_RUN_ID"] == first["SWANLAB_RUN_ID"] == first["ORCH_JOB_UID"]
    assert first["WANDB_RESUME"] == first["SWANLAB_RESUME"] == "allow"
    assert {k: v for k, v in second.items() if k != "MLFLOW_RUN_ID"} == {
        k: v for k, v in first.items() if k != "MLFLOW_RUN_ID"
    }
    assert first["MLFLOW_RUN_ID"] is None and second["MLFLOW_RUN_ID"]  # noted by OrchLoop after step 1
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(store.as_uri())
    runs = client.search_runs([client.get_experiment_by_name("cmd-tracked").experiment_id])
    assert [r.info.run_id for r in runs] == [second["MLFLOW_RUN_ID"]]
    assert runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")]
    assert sorted(set(steps)) == [0, 1, 2, 3]


def test_mlflow_at_a_dead_server_leaves_a_built_in_job_s_outcome_unchanged(workload, tmp_path):
    # A port bound and never listened on: connections are refused, and while the socket is held no
    # other test (another xdist worker) can take the port and answer.
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    job = builtin_job(
        workload, "deadtracker", 10, f'backends = ["mlflow"]\nmlflow_uri = "http://user:pw-9x@127.0.0.1:{port}"'
    )
    home = tmp_path / "home"
    try:
        res = orch(home, "run", str(job))
    finally:
        dead.close()
    assert res.returncode == 0, res.stderr[-3000:]
    shown = json.loads(orch(home, "show", "1", "--json").stdout)
    assert shown["state"] == "succeeded" and shown["result"]["steps"] == 10
    text = orch(home, "show", "1").stdout
    assert "tracker:   mlflow" in text and "WARNING not logging" in text
    assert res.stderr.count("tracker mlflow is not logging") == 1
    shown_json = orch(home, "show", "1", "--json").stdout
    assert "pw-9x" not in res.stderr and "pw-9x" not in text and "pw-9x" not in shown_json
    assert "http://***@127.0.0.1" in shown_json  # the spec's mlflow_uri, its password masked
