"""tracking.json in the run folder: which tracker runs a job logs to (ids, project, mode), the last
step each was sent, and why one is not logging. The built-in runner and the helpers for command
jobs (OrchCallback, OrchTrainerCallback, OrchLoop) write it; `orch show` prints it, the next
attempt's environment takes MLflow's run id from it, and the mirror carries it to an adopting
machine. Standard library only. Nothing written here or printed may hold a secret: `redact`."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from orchestrator.contract import ENV_JOB_UID, EX_CHECKPOINTED, TRACKING, read_json, write_json_atomic
from orchestrator.redaction import environ_secrets
from orchestrator.redaction import redact as mask


def redact(text: str, environ: Optional[dict[str, str]] = None) -> str:
    """`text` masked by the one redaction rule (orchestrator/redaction.py: URL credentials,
    key=value secrets, the values of the credential variables in `environ`), on one line of at
    most 300 characters, as tracking.json and a warning line hold it."""
    env = os.environ if environ is None else environ
    out = " ".join(mask(str(text), environ_secrets(env)).split())
    return out if len(out) <= 300 else out[:297] + "..."


class TrackingNotes:
    """tracking.json, read once and rewritten (atomically) when a field changes. Thread-safe: each
    tracker's worker thread writes its own backend's entry."""

    def __init__(self, run_dir: Optional[Path], uid: str = ""):
        self.path = Path(run_dir) / TRACKING if run_dir else None
        self._lock = threading.Lock()
        self.data: dict[str, Any] = (read_json(self.path) if self.path else None) or {}
        if uid:
            self.data["uid"] = uid
        backends = self.data.get("backends")
        self.data["backends"] = backends if isinstance(backends, dict) else {}
        self._warned: set[str] = set()

    def backend(self, name: str) -> dict[str, Any]:
        entry = self.data["backends"].get(name)
        return dict(entry) if isinstance(entry, dict) else {}

    def update(self, name: str, **fields: Any) -> None:
        with self._lock:
            entry = self.backend(name)
            entry.update(fields)
            self.data["backends"][name] = entry
            self.data["updated_at"] = time.time()
            self._write()

    def warn(self, name: str, what: str) -> None:
        """One warning per tracker in the log, and the reason in tracking.json for `orch show`.
        The job goes on: a tracker never fails it."""
        text = redact(what)
        self.update(name, warning=text, warned_at=time.time())
        if name not in self._warned:
            self._warned.add(name)
            print(
                f"[orch] warning: tracker {name} is not logging: {text} (the job goes on)", file=sys.stderr, flush=True
            )

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            write_json_atomic(self.path, self.data)
        except OSError:
            pass  # a full disk is the checkpoint writer's to report


def record_active_runs(run_dir: Optional[Path], uid: str = "") -> None:
    """A command job's script: note the runs its own trackers opened (already imported by it;
    never imported here), so the next attempt continues them (MLFLOW_RUN_ID) and `orch show`
    names them. Errors are swallowed: tracking never fails a job."""
    if run_dir is None:
        return
    notes = TrackingNotes(run_dir, uid or os.environ.get(ENV_JOB_UID, ""))
    for name, probe in (("wandb", _wandb_run), ("mlflow", _mlflow_run), ("swanlab", _swanlab_run)):
        module = sys.modules.get(name)
        if module is None:
            continue
        try:
            fields = probe(module)
        except Exception:  # noqa: BLE001 (no run open, or a library's own error: nothing to note)
            continue
        if fields and notes.backend(name).get("run_id") != fields["run_id"]:
            notes.update(name, **fields)


def _wandb_run(wandb: Any) -> Optional[dict[str, Any]]:
    run = getattr(wandb, "run", None)
    return {"run_id": run.id, "project": getattr(run, "project", None)} if run is not None else None


def _mlflow_run(mlflow: Any) -> Optional[dict[str, Any]]:
    active = mlflow.active_run()
    return {"run_id": active.info.run_id, "experiment_id": active.info.experiment_id} if active is not None else None


def _swanlab_run(swanlab: Any) -> Optional[dict[str, Any]]:
    run = swanlab.get_run()
    return {"run_id": run.id} if run is not None and getattr(run, "id", None) else None


def pause_active_runs() -> None:
    """A command job is about to exit 75 (checkpointed, to be resumed): its trackers' runs must not
    end as finished. W&B: mark_preempting (the run shows preempted, and the next attempt resumes it
    by WANDB_RUN_ID); MLflow: the run ends KILLED (RUNNING again when resumed); SwanLab: aborted."""
    pauses = {
        "wandb": (_wandb_run, _wandb_pause),
        "mlflow": (_mlflow_run, lambda m: m.end_run(status="KILLED")),
        "swanlab": (_swanlab_run, lambda m: m.finish(state="aborted")),
    }
    for name, (probe, pause) in pauses.items():
        module = sys.modules.get(name)
        try:
            if module is None or not probe(module):
                continue
        except Exception:  # noqa: BLE001 (no run open)
            continue
        try:
            pause(module)
        except Exception as exc:  # noqa: BLE001 (the tracker's own error never reaches the job)
            print(f"[orch] warning: tracker {name}: {redact(str(exc))}", file=sys.stderr, flush=True)


def _wandb_pause(wandb: Any) -> None:
    run = wandb.run
    run.mark_preempting()
    run.finish(exit_code=EX_CHECKPOINTED)


class ScriptRuns:
    """What OrchCallback, OrchTrainerCallback and OrchLoop do for the trackers of a command job's
    script (which opens its runs itself, continuing them by WANDB_RUN_ID, SWANLAB_RUN_ID and
    MLFLOW_RUN_ID): note its runs after the first step, and pause them before exiting 75."""

    def __init__(self, run_dir: Optional[Path], enabled: bool = True):
        self.run_dir, self.enabled = run_dir, enabled and run_dir is not None
        self._noted = False

    def step(self) -> None:
        if self.enabled and not self._noted:
            self._noted = True
            if any(sys.modules.get(m) is not None for m in ("wandb", "mlflow", "swanlab")):
                record_active_runs(self.run_dir)

    def preempted(self) -> None:
        if self.enabled:
            record_active_runs(self.run_dir)
            pause_active_runs()
