"""The trackers' own calls, one class per library, each run on its tracker's worker thread
(training/tracking/trackers.py): W&B and MLflow through Lightning's WandbLogger and MLFlowLogger, SwanLab
through swanlab.init / log / finish (its Lightning logger subclasses the `lightning` package's
Logger, which this runner's `pytorch_lightning` Trainer does not take). The libraries are
imported inside `open`, on that thread, only when a job names them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from orchestrator.contract import EX_CHECKPOINTED, EX_OK, ENV_ATTEMPT, TRACKERS, tracker_run_id

from training.tracking.notes import redact

FINISH_STATE = {
    "wandb": {"finished": EX_OK, "failed": 1, "paused": EX_CHECKPOINTED},
    "mlflow": {"finished": "FINISHED", "failed": "FAILED", "paused": "KILLED"},
    "swanlab": {"finished": "success", "failed": "crashed", "paused": "aborted"},
}


class Backend:
    """One tracker's calls; each runs on the tracker's worker thread."""

    name = ""

    def __init__(self, job: "JobInfo"):
        self.job = job

    def open(self) -> dict[str, Any]:  # the fields tracking.json records
        raise NotImplementedError

    def hyperparams(self, params: dict[str, Any]) -> None: ...

    def metrics(self, metrics: dict[str, float], step: Optional[int]) -> None: ...

    def resumed(self, step: int, text: str) -> None: ...

    def summary(self, values: dict[str, Any]) -> None: ...

    def close(self, outcome: str) -> None: ...


class JobInfo:
    def __init__(self, *, uid: str, name: str, project: str, mode: str, mlflow_uri: Optional[str], run_dir: Path):
        self.uid, self.name, self.project, self.mode = uid, name, project, mode
        self.mlflow_uri, self.run_dir = mlflow_uri, run_dir
        self.run_id = tracker_run_id(uid) if uid else None
        self.local_dir = run_dir / TRACKERS
        self.resuming = False
        self.recorded: dict[str, Any] = {}


class WandbBackend(Backend):
    name = "wandb"

    def open(self) -> dict[str, Any]:
        import wandb
        from pytorch_lightning.loggers import WandbLogger

        # the job's own [env] WANDB_DIR wins; else the run folder, where `orch pull` finds it
        save_dir = Path(os.environ.get("WANDB_DIR") or self.job.local_dir)
        save_dir.mkdir(parents=True, exist_ok=True)
        self.inner = WandbLogger(
            name=self.job.name,
            project=self.job.project,
            id=self.job.run_id,
            save_dir=str(save_dir),
            offline=self.job.mode == "offline",
            resume="allow",
            tags=["orch"],
            settings=wandb.Settings(init_timeout=60, login_timeout=10, console="off"),  # never waits on a prompt long
        )
        run = self.inner.experiment
        return {"run_id": run.id, "project": self.job.project, "mode": self.job.mode, "url": run.url or None}

    def hyperparams(self, params: dict[str, Any]) -> None:
        self.inner.log_hyperparams(params)

    def metrics(self, metrics: dict[str, float], step: Optional[int]) -> None:
        if step is None:
            self.inner.log_metrics(metrics, step)
        else:  # W&B's own step = the optimizer step: an offline attempt starts its count at 0, and
            # `wandb sync` of the attempts' folders into one run keeps only rising steps
            self.inner.experiment.log({**metrics, "trainer/global_step": step}, step=step)

    def resumed(self, step: int, text: str) -> None:
        run = self.inner.experiment
        run.log({"orch/resumed_at_step": step, "trainer/global_step": step}, step=step)
        run.notes = ((run.notes or "") + "\n" + text).strip()

    def summary(self, values: dict[str, Any]) -> None:
        self.inner.experiment.summary.update({f"final/{k}": v for k, v in values.items()})

    def close(self, outcome: str) -> None:
        run = self.inner.experiment
        if outcome == "paused":
            run.mark_preempting()  # the run shows preempted, not finished or crashed, until resumed
        run.finish(exit_code=FINISH_STATE["wandb"][outcome])


class MLflowBackend(Backend):
    name = "mlflow"

    def open(self) -> dict[str, Any]:
        from mlflow.tracking import MlflowClient
        from pytorch_lightning.loggers import MLFlowLogger

        uri = self.job.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
        if not uri:  # no server named: a file store in the run folder
            uri = (self.job.local_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks before using one
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(self.job.project)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(self.job.project)
        run_id = self.job.recorded.get("run_id")
        if not run_id and self.job.uid:  # not recorded here (a lost file): find it by its tag
            found = client.search_runs([exp_id], f"tags.`orch.job_uid` = '{self.job.uid}'", max_results=1)
            run_id = found[0].info.run_id if found else None
        self.created = run_id is None
        if run_id:
            client.update_run(run_id, status="RUNNING")
        self.inner = MLFlowLogger(
            experiment_name=self.job.project,
            run_name=self.job.name,
            tracking_uri=uri,
            tags={"orch.job_uid": self.job.uid},
            run_id=run_id,
        )
        self.client = self.inner.experiment
        return {"run_id": self.inner.run_id, "project": self.job.project, "url": redact(uri), "experiment_id": exp_id}

    def hyperparams(self, params: dict[str, Any]) -> None:
        if self.created:  # MLflow's params are immutable: a resumed run keeps the first attempt's
            self.inner.log_hyperparams(params)

    def metrics(self, metrics: dict[str, float], step: Optional[int]) -> None:
        self.inner.log_metrics(metrics, step)

    def resumed(self, step: int, text: str) -> None:
        attempt = os.environ.get(ENV_ATTEMPT) or "0"
        self.client.set_tag(self.inner.run_id, f"orch.resume.attempt-{attempt}", text)
        self.client.log_metric(self.inner.run_id, "orch/resumed_at_step", step, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            self.client.set_tag(self.inner.run_id, f"orch.final.{key}", str(value)[:5000])

    def close(self, outcome: str) -> None:
        self.client.set_terminated(self.inner.run_id, FINISH_STATE["mlflow"][outcome])


class SwanLabBackend(Backend):
    name = "swanlab"

    def open(self) -> dict[str, Any]:
        import swanlab

        self.swanlab = swanlab
        self.job.local_dir.mkdir(parents=True, exist_ok=True)
        self.run = swanlab.init(
            project=self.job.project,
            experiment_name=self.job.name,
            id=self.job.run_id,
            resume="allow",
            mode="offline" if self.job.mode == "offline" else "online",
            log_dir=str(self.job.local_dir / "swanlog"),
            tags=["orch"],
        )
        return {"run_id": self.run.id, "project": self.job.project, "mode": self.job.mode}

    def hyperparams(self, params: dict[str, Any]) -> None:
        self.run.config.update({k: plain(v) for k, v in params.items()})

    def metrics(self, metrics: dict[str, float], step: Optional[int]) -> None:
        self.run.log(dict(metrics), step=step)

    def resumed(self, step: int, text: str) -> None:
        self.run.log({"orch/resumed_at_step": step}, step=step)
        attempt = os.environ.get(ENV_ATTEMPT) or "0"
        self.run.config.update({f"orch_resume_attempt_{attempt}": text})

    def summary(self, values: dict[str, Any]) -> None:
        self.run.config.update({f"orch_final_{k}": plain(v) for k, v in values.items()})

    def close(self, outcome: str) -> None:
        state = FINISH_STATE["swanlab"][outcome]
        self.swanlab.finish(state=state, error="the job failed" if state == "crashed" else None)


BACKENDS: dict[str, type[Backend]] = {"wandb": WandbBackend, "mlflow": MLflowBackend, "swanlab": SwanLabBackend}


def plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
