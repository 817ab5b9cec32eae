"""The Slurm executor: each attempt is one `sbatch` of a script written into the job's run folder
(attempt-<n>.sbatch). The script's one command, orchestrator.executors.slurm.step, runs the job
under `srun` with the geometry from job.toml (`nodes`, `gpus` per node) and writes
attempt-<n>.exit into the run folder, which the nodes share with the daemon; so the tick settles a
Slurm attempt with the same settle_attempt as a local one.

Requeue: every attempt is a new submission with `--no-requeue`. Slurm never reruns a script from its
start behind orch's back, ORCH_ATTEMPT stays orch's attempt number, and an exit 75 (preemption with
a grace time, the walltime warning `--signal=TERM@warn_before`, orch's own stop) comes back to the
daemon, which queues the job and submits it again to resume from its newest checkpoint. A node
failure (NODE_FAIL), or a preemption the job did not answer, leaves no exit record: the attempt is
lost, and the tick requeues it uncharged.

State: `refresh` runs ONE `squeue -t all -u <user>` per poll for all tracked attempts (and one
batched `sacct` only for attempts squeue no longer knows, when the cluster has accounting); the
answers are cached for alive/exit/describe. An attempt Slurm cannot be asked about (a failed or
timed-out query) is alive: unknown is never read as an ending.

Cost: `billable(job)` is True only while Slurm says the attempt is RUNNING; the daemon's accrual
charges its GPUs x that time x gpu_hour (nothing while PENDING, no idle cost for the cluster)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ...contract import (
    attempt_exit,
    attempt_log,
    attempt_rank_logs,
    attempt_slurm_info,
    attempt_submitted,
    checkpoint_dir,
    read_json,
    write_exit_record,
)
from ...home.paths import Home
from ...host.cluster_env import missing_note, missing_pass_env, slurm_basics, split_secrets
from ...host.secret_file import remove_secret_file, write_secret_file
from ...model.records import AttemptLaunch, Job
from .query import BILLABLE
from .script import SlurmError, check_shared, write_script
from .step import rank_log
from .submit import SUBMITTING, Sbatch, key_of
from .watch import Cancel, SlurmWatch

if TYPE_CHECKING:
    from ...spec.config import SlurmSection


class SlurmExecutor(SlurmWatch):
    """Submission, signals and logs; the watching is SlurmWatch's, the commands SlurmCommands'."""

    name = "slurm"

    def __init__(
        self,
        home: Home,
        slurm: "SlurmSection",
        *,
        python: str = sys.executable,
        environ: Optional[Mapping[str, str]] = None,
    ):
        super().__init__(home, slurm, environ=environ)
        self.python = python

    # -- capacity and cost (optional Executor capabilities the tick asks for) -------------------

    def notice(self, job: Job) -> Optional[str]:
        return None

    def cluster_gpus(self) -> Optional[tuple[float, float]]:
        return None  # Slurm's free GPUs are not asked: it queues what does not fit

    def gpu_room(self, now: float) -> Optional[tuple[int, str]]:
        return None  # Slurm queues what does not fit ([slurm] max_gpus caps what orch submits)

    def billable(self, job: Job) -> bool:
        """Charged only while Slurm runs it: pending costs nothing."""
        t = self.cache.jobs.get(self.slurm_id(job) or "")
        return bool(t and t.answer and t.answer.state in BILLABLE)

    # -- start ---------------------------------------------------------------------------------

    def start(self, launch: AttemptLaunch) -> dict[str, Any]:
        """Write the attempt's script and queue its sbatch for the next exchange (slurm/submit.py),
        off the tick's lock; its Slurm id is recorded by the refresh after it."""
        run_dir = launch.run_dir
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        checkpoint_dir(run_dir).mkdir(exist_ok=True)
        # Slurm keeps the job's environment (sbatch's) with the job: the basics and what orch gives
        # the attempt, never the daemon's whole environment nor a secret (host/cluster_env.py).
        public, secret = split_secrets(launch.job_vars, launch.spec)
        missing = missing_pass_env(launch.job_vars, launch.spec)
        if missing:
            with open(run_dir / attempt_log(launch.attempt), "a", encoding="utf-8") as f:
                f.write(f"[orch] attempt {launch.attempt} on Slurm: {missing_note(missing)}\n")
        try:
            check_shared(self.cfg, run_dir)
            script = write_script(
                self.cfg, launch, self.job_name(launch.job_id, launch.attempt), self.python, with_secrets=bool(secret)
            )
        except SlurmError as exc:
            with open(run_dir / attempt_log(launch.attempt), "a", encoding="utf-8") as f:
                f.write(f"[orch] cannot submit attempt {launch.attempt} to Slurm: {exc}\n")
            raise
        env = {**slurm_basics(launch.env), **public}
        if "SLURM_CONF" in self.environ:
            env["SLURM_CONF"] = self.environ["SLURM_CONF"]
        if int(launch.spec.get("gpus") or 0) > 0:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's gres sets it on the node
        for key in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
            env.pop(key)  # a daemon started inside an allocation must not pass its geometry on
        if secret:  # before sbatch: the batch step reads it first thing on its node
            write_secret_file(run_dir, launch.attempt, secret)
        sbatch = Sbatch(["sbatch", "--parsable", str(script)], env, run_dir, launch.job_id, launch.attempt, script.name)
        with self.submits.mu:
            self.submits.queued[(launch.job_id, launch.attempt)] = sbatch
        where = "Slurm: not submitted yet (sbatch is on its way)"
        return {
            "executor_ref": {"submitted_at": time.time(), "state": SUBMITTING, "where": where, "script": script.name}
        }

    def adopt(self, job: Job) -> Optional[dict[str, Any]]:
        """The daemon died between sbatch and recording the id: find it by the file start() wrote,
        else by the job name."""
        if not job.attempt:
            return None
        run_dir = self.home.run_dir(job.id)
        ref = read_json(run_dir / attempt_submitted(job.attempt))
        if ref and ref.get("slurm_job_id"):
            return {"executor_ref": ref}
        sid = self._find_by_name(job.id, job.attempt)
        return (
            {"executor_ref": {"slurm_job_id": sid, "submitted_at": time.time(), "where": f"Slurm {sid}: adopted"}}
            if sid
            else None
        )

    # -- signals -------------------------------------------------------------------------------

    def terminate(self, job: Job) -> bool:
        """ "Checkpoint now": SIGTERM to the job's srun tasks on every node (`scancel --signal=TERM`,
        no --full: that would make srun kill them). A pending job is simply cancelled. The scancels
        run in the next exchange, off the tick's lock."""
        sid = self.slurm_id(job)
        if sid is None:
            return self._stop_unsubmitted(job)
        t = self.cache.jobs.get(sid)
        state = t.answer.state if t and t.answer else None
        if state in (None, "PENDING") and not self._started(job):

            def then(cancelled: bool) -> None:
                if cancelled:
                    self._pending_exit(job, sid)
                else:  # not taken as a plain cancel: the job's own stop, as for a running one
                    self._signal_stop(sid)

            self.ask_cancel(Cancel(["scancel", sid], then))
            return True
        self._signal_stop(sid)
        return True

    def _stop_unsubmitted(self, job: Job) -> bool:
        """A stop before the Slurm id is known: a queued sbatch is dropped (the attempt never ran);
        one already on its way is stopped once the refresh records its id."""
        with self.submits.mu:
            dropped = self.submits.queued.pop(key_of(job), None)
            if dropped is None:
                self.submits.stop_asked.add(key_of(job))
        if dropped is not None and job.attempt:
            now = time.time()
            run_dir = self.home.run_dir(job.id)
            write_exit_record(run_dir, job.attempt, None, 15, now, now, slurm_state="CANCELLED before sbatch")
            with open(run_dir / attempt_log(job.attempt), "a", encoding="utf-8") as f:
                f.write(f"[orch] attempt {job.attempt} stopped before it was submitted to Slurm\n")
        return True

    def _signal_stop(self, sid: str) -> None:
        self.ask_cancel(Cancel(["scancel", "--batch", "--signal=USR2", sid]))  # "a stop was asked"
        self.ask_cancel(Cancel(["scancel", "--signal=TERM", sid]))

    def _started(self, job: Job) -> bool:
        return (self.home.run_dir(job.id) / attempt_slurm_info(job.attempt)).exists()

    def _pending_exit(self, job: Job, sid: str) -> None:
        """Cancelled before it ran: the exit record is ours to write (the wrapper never will)."""
        path = self.home.run_dir(job.id) / attempt_exit(job.attempt)
        if path.exists() or self._started(job):
            return
        now = time.time()
        write_exit_record(
            self.home.run_dir(job.id),
            job.attempt,
            None,
            15,
            now,
            now,
            slurm_job_id=sid,
            slurm_state="CANCELLED while PENDING",
        )
        with open(self.home.run_dir(job.id) / attempt_log(job.attempt), "a", encoding="utf-8") as f:
            f.write(f"[orch] Slurm job {sid} cancelled while pending\n")

    def kill(self, job: Job) -> bool:
        """The grace is over: `scancel` (SIGTERM to every step and the batch script, SIGKILL after
        Slurm's KillWait), in the next exchange. The wrapper still writes the exit record; the
        intent decides."""
        sid = self.slurm_id(job)
        if sid is None:
            return self._stop_unsubmitted(job)
        self.ask_cancel(Cancel(["scancel", sid]))
        return True

    def clear_lost(self, job: Job) -> None:
        """Lost (NODE_FAIL, preempted without answering, gone): make sure Slurm holds nothing of it."""
        if job.attempt:
            remove_secret_file(self.home.run_dir(job.id), job.attempt)
        sid = self.slurm_id(job)
        if sid is None:
            self._stop_unsubmitted(job)
            return
        t = self.cache.jobs.get(sid)
        if not (t and t.answer and t.answer.ended):
            self.ask_cancel(Cancel(["scancel", sid]))

    def dump_stacks(self, job: Job) -> str:
        """The built-in runner: SIGUSR1 to the step's tasks on every node (`scancel --signal=USR1`,
        no --batch: the wrapper is not the job), which faulthandler turns into every thread's
        stack in each rank's log. A command job is not signalled: SIGUSR1's default action would
        kill a program that did not ask for it (and py-spy would have to run on its node)."""
        sid = self.slurm_id(job)
        if sid is None or not self._started(job):
            return "no stack dump: the Slurm job has not started"
        if job.kind == "command":
            return "no stack dump: a command job on Slurm is not sent SIGUSR1 (it could kill it)"
        r = self._run(["scancel", "--signal=USR1", sid], what="scancel")
        if r is None or r.returncode != 0:
            why = (r.stderr.strip() if r is not None else "") or "scancel did not answer"
            return f"no stack dump: {why}"
        return "Python stacks dumped into the rank logs (SIGUSR1 to the Slurm step's tasks, faulthandler)"

    # -- looking -------------------------------------------------------------------------------

    def log_paths(self, job: Job) -> list[Path]:
        if not job.attempt:
            return []
        run_dir = self.home.run_dir(job.id)
        ranks = sorted(
            run_dir.glob(attempt_rank_logs(job.attempt)), key=lambda p: int(p.name.rsplit("-", 1)[1].split(".")[0])
        )
        return [run_dir / rank_log(job.attempt, 0), *ranks]
