"""The Ray executor: each attempt is one Ray job submitted through the head's Jobs REST API (no
`ray` import: ray/api.py), named `orch-<job uid>-<attempt>`, asking `entrypoint_num_gpus = gpus`.
Its entrypoint is ray/step.py on the node Ray picks, which runs the job's own command with the
contract's environment, writes the log and the exit record into the run folder (a filesystem
every node shares, as with Slurm), and passes Ray's stop on as "checkpoint now" with the grace.

Ray only places the process; orch decides everything else. Ray Jobs are never retried by Ray: a
job whose node dies ends FAILED, which the tick reads as a lost attempt (ray/watch.py) and resumes
elsewhere from the newest checkpoint, not charged to `retries`.

Stops: orch's stop (cancel, budget, a notice) is Ray's stop_job, which SIGTERMs the step and the
job, then SIGKILLs after RAY_JOB_STOP_WAIT_TIME_S: orch sets that to the job's grace (and more), so
the job saves its checkpoint. A job still PENDING in Ray is stopped and its exit record written
here (it never ran).

Cost: `billable(job)` only while Ray says RUNNING: GPUs x that time x gpu_hour."""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ...contract import (
    attempt_exit,
    attempt_log,
    attempt_ray_info,
    checkpoint_dir,
    ray_submission_id,
    write_exit_record,
)
from ...home.paths import Home
from ...host.cluster_env import missing_note, missing_pass_env, split_secrets
from ...host.secret_file import remove_secret_file, write_secret_file
from ...model.records import AttemptLaunch, Job
from .api import PENDING, RayJobsApi
from .watch import UNSUBMITTED, RayWatch
from .wire import Stop, Submit, note

if TYPE_CHECKING:
    from ...spec.ray_section import RaySection

log = logging.getLogger("orch.executor.ray")

STOP_WAIT_BEYOND_GRACE_S = 15  # Ray's SIGKILL comes this long after the job's own grace
# Of what orch gives an attempt, what Ray sets on the node itself.
NOT_PASSED = ("CUDA_VISIBLE_DEVICES", "RAY_ADDRESS")


class RayExecutor(RayWatch):
    name = "ray"

    def __init__(
        self, home: Home, ray: "RaySection", *, python: str = sys.executable, api: Optional[RayJobsApi] = None
    ):
        super().__init__(home, ray, api)
        self.python = python

    # -- start -----------------------------------------------------------------------------------

    def submit_body(self, launch: AttemptLaunch) -> dict[str, Any]:
        """The Ray job of an attempt. Ray keeps it in its job table, which its dashboard serves to
        anyone who reaches the port: only what orch gives the attempt goes in, never the daemon's
        environment, and never a secret (those travel in the secret file: host/cluster_env.py)."""
        public, secret = split_secrets(launch.job_vars, launch.spec)
        step = [self.python, "-m", "orchestrator.executors.ray.step", "--run-dir", str(launch.run_dir)]
        step += ["--attempt", str(launch.attempt), "--grace", str(launch.grace_s)]
        step += ["--with-secrets"] if secret else []
        step += (["--cwd", launch.cwd] if launch.cwd else []) + ["--", *launch.argv]
        passthrough = dict(self.cfg.runtime_env)
        env = {k: v for k, v in public.items() if k not in NOT_PASSED}
        env.update(passthrough.get("env_vars") or {})
        env["RAY_JOB_STOP_WAIT_TIME_S"] = str(int(launch.grace_s) + STOP_WAIT_BEYOND_GRACE_S)
        body: dict[str, Any] = {
            "entrypoint": "exec " + shlex.join(step),
            "submission_id": ray_submission_id(launch.job_uid or str(launch.job_id), launch.attempt),
            "runtime_env": {**passthrough, "env_vars": env},
            "metadata": {"orch_job": str(launch.job_id), "orch_attempt": str(launch.attempt)},
        }
        gpus = int(launch.spec.get("gpus") or 0)
        if gpus:
            body["entrypoint_num_gpus"] = gpus
        if self.cfg.entrypoint_num_cpus is not None:
            body["entrypoint_num_cpus"] = self.cfg.entrypoint_num_cpus
        if self.cfg.memory_gb is not None:
            body["entrypoint_memory"] = int(self.cfg.memory_gb * 2**30)
        return body

    def start(self, launch: AttemptLaunch) -> dict[str, Any]:
        """Hand the attempt to the next exchange (ray/wire.py), which checks that a node can hold
        it and submits it off the tick's lock; no call to the head here. Its handle is known now:
        the submission id, the same on every submit (Ray never runs one twice)."""
        run_dir = launch.run_dir
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        checkpoint_dir(run_dir).mkdir(exist_ok=True)
        body = self.submit_body(launch)
        sid = body["submission_id"]
        gpus = int(launch.spec.get("gpus") or 0)
        missing = missing_pass_env(launch.job_vars, launch.spec)
        if missing:
            note(run_dir, launch.attempt, missing_note(missing))
        _, secret = split_secrets(launch.job_vars, launch.spec)
        if secret:  # before any submit, this one or a later one: the step reads it first thing
            write_secret_file(run_dir, launch.attempt, secret)
        self.wire.ask_submit(sid, Submit(body, launch.job_id, launch.attempt, run_dir, gpus))
        ref: dict[str, Any] = {"submission_id": sid, "submitted_at": time.time(), "address": self.cfg.address}
        return {"executor_ref": {**ref, "state": UNSUBMITTED, "where": f"Ray {sid}: not submitted yet"}}

    def adopt(self, job: Job) -> Optional[dict[str, Any]]:
        """The daemon died between starting the attempt and recording it: its submission id is
        known without asking; the next look says whether Ray has it (gone: lost, requeued)."""
        sid = self.sid(job)
        return {"executor_ref": {"submission_id": sid, "submitted_at": time.time()}} if sid else None

    # -- signals ---------------------------------------------------------------------------------

    def terminate(self, job: Job) -> bool:
        """ "Checkpoint now": Ray's stop (SIGTERM to the step and the job; SIGKILL after the grace),
        sent by the next exchange, off the tick's lock. A job never submitted is simply stopped; one
        still pending in Ray gets its exit record here once Ray took the stop (it never ran)."""
        sid = self.sid(job)
        if sid is None:
            return False
        if self.wire.forget_submit(sid):
            self._exit_unstarted(job, sid, "cancelled before the Ray head took it")
            return True
        t = self.jobs.get(sid)
        pending = t is None or t.answer is None or t.answer.status == PENDING

        def then() -> None:
            if pending and not self._started(job):
                self._exit_unstarted(job, sid, "stopped while pending in Ray")

        self.wire.ask_stop(Stop(sid, job.id, then))
        return True

    def _started(self, job: Job) -> bool:
        return (self.home.run_dir(job.id) / attempt_ray_info(job.attempt)).exists()

    def _exit_unstarted(self, job: Job, sid: str, why: str) -> None:
        run_dir = self.home.run_dir(job.id)
        if (run_dir / attempt_exit(job.attempt)).exists():
            return
        now = time.time()
        write_exit_record(run_dir, job.attempt, None, 15, now, now, ray_status=why)
        with open(run_dir / attempt_log(job.attempt), "a", encoding="utf-8") as f:
            f.write(f"[orch] Ray job {sid} {why}\n")

    def kill(self, job: Job) -> bool:
        """The grace is over: Ray's stop again (its SIGKILL follows its own wait), by the next exchange."""
        sid = self.sid(job)
        if not sid:
            return False
        self.wire.ask_stop(Stop(sid, job.id))
        return True

    def clear_lost(self, job: Job) -> None:
        """Lost: make sure Ray holds nothing of it (a start timeout leaves nothing; a job Ray still
        thinks runs is stopped). The step on a lost node killed its own job when Ray let go of it."""
        if job.attempt:
            remove_secret_file(self.home.run_dir(job.id), job.attempt)
        sid = self.sid(job)
        if not sid:
            return
        self.wire.forget_submit(sid)
        t = self.jobs.get(sid)
        if t is not None and t.answer is not None and not t.answer.ended:
            self.wire.ask_stop(Stop(sid, job.id))

    def dump_stacks(self, job: Job) -> str:
        return "no stack dump: a Ray attempt runs on its node, which the daemon cannot signal"

    # -- looking ---------------------------------------------------------------------------------

    def log_paths(self, job: Job) -> list[Path]:
        return [self.home.run_dir(job.id) / attempt_log(job.attempt)] if job.attempt else []
