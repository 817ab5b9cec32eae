"""The Slurm executor: each attempt is one `sbatch` of a script written into the job's run folder
(attempt-<n>.sbatch). The script's one command, orchestrator.executors.slurm_step, runs the job
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

import getpass
import hashlib
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from ..contract import (
    attempt_exit,
    attempt_log,
    attempt_rank_logs,
    attempt_slurm_info,
    attempt_submitted,
    checkpoint_dir,
    exit_record,
    read_json,
    write_exit_record,
    write_json_atomic,
)
from ..paths import Home
from ..records import AttemptLaunch, Job
from ..states import JobState
from .slurm_query import (
    BILLABLE,
    INFRA_ENDS,
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SlurmJob,
    accounting_disabled,
    expand_nodelist,
    parse_sacct,
    parse_sbatch,
    parse_squeue,
)
from .slurm_script import SlurmError, check_shared, write_script
from .slurm_step import rank_log

if TYPE_CHECKING:
    from ..config import SlurmSection

log = logging.getLogger("orch.executor.slurm")

# An ended job whose exit record is not visible yet (NFS attribute caching) is given this long.
EXIT_RECORD_WAIT_S = 15.0
QUERY_TIMEOUT_S = 30.0
SUBMITTED = "SUBMITTED"  # our own word for "sbatch accepted it, squeue has not shown it yet"


@dataclass
class _Tracked:
    answer: Optional[SlurmJob] = None  # the last answer Slurm gave about it
    ended_seen_at: Optional[float] = None  # first poll that saw it ended (or gone)
    exit_record: Optional[dict[str, Any]] = None
    gone: bool = False  # squeue (and sacct, when on) no longer know it
    described: str = ""


@dataclass
class _Cache:
    polled_at: float = 0.0
    ok: bool = False  # the last squeue answered
    jobs: dict[str, _Tracked] = field(default_factory=dict)


class SlurmExecutor:
    name = "slurm"
    bills_by_allocation = True  # the cluster's GPUs are charged while allocated, never idle

    def __init__(
        self,
        home: Home,
        slurm: "SlurmSection",
        *,
        python: str = sys.executable,
        environ: Optional[Mapping[str, str]] = None,
    ):
        self.home = home
        self.cfg = slurm
        self.python = python
        self.environ = dict(os.environ if environ is None else environ)
        if slurm.slurm_conf:
            self.environ["SLURM_CONF"] = str(Path(os.path.expanduser(slurm.slurm_conf)).resolve())
        self.user = getpass.getuser()
        self.tag = hashlib.sha1(str(home.root.resolve()).encode()).hexdigest()[:6]
        self.cache = _Cache()
        self.accounting: Optional[bool] = {"on": True, "off": False}.get(slurm.accounting)
        self._store = None
        self.queries = {"squeue": 0, "sacct": 0, "sbatch": 0, "scancel": 0}

    # -- capacity and cost (optional Executor capabilities the tick asks for) -------------------

    def gpu_slots(self) -> list[int]:
        """How many GPUs orch keeps submitted at once ([slurm] max_gpus): Slurm does the placing."""
        return list(range(self.cfg.max_gpus))

    def billable(self, job: Job) -> bool:
        """Charged only while Slurm runs it: pending costs nothing."""
        t = self.cache.jobs.get(self.slurm_id(job) or "")
        return bool(t and t.answer and t.answer.state in BILLABLE)

    # -- start ---------------------------------------------------------------------------------

    def start(self, launch: AttemptLaunch) -> dict[str, Any]:
        run_dir = launch.run_dir
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        checkpoint_dir(run_dir).mkdir(exist_ok=True)
        try:
            check_shared(self.cfg, run_dir)
            script = write_script(self.cfg, launch, self.job_name(launch.job_id, launch.attempt), self.python)
            env = dict(launch.env)
            if "SLURM_CONF" in self.environ:
                env["SLURM_CONF"] = self.environ["SLURM_CONF"]
            if int(launch.spec.get("gpus") or 0) > 0:
                env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's gres sets it on the node
            for key in [
                k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"
            ]:
                env.pop(key)  # a daemon started inside an allocation must not pass its geometry on
            r = self._run(["sbatch", "--parsable", str(script)], env=env, what="sbatch")
        except SlurmError as exc:
            with open(run_dir / attempt_log(launch.attempt), "a", encoding="utf-8") as f:
                f.write(f"[orch] cannot submit attempt {launch.attempt} to Slurm: {exc}\n")
            raise
        job_id = parse_sbatch(r.stdout) if r is not None and r.returncode == 0 else None
        if r is None:  # sbatch timed out: the job may have been queued all the same; never run it twice
            job_id = self._find_by_name(launch.job_id, launch.attempt)
        if not job_id:
            why = (r.stderr or r.stdout).strip() if r is not None else "sbatch did not answer"
            with open(run_dir / attempt_log(launch.attempt), "a", encoding="utf-8") as f:
                f.write(f"[orch] sbatch refused attempt {launch.attempt}: {why}\n")
            raise SlurmError(f"sbatch refused the job: {why}")
        now = time.time()
        ref = {
            "slurm_job_id": job_id,
            "submitted_at": now,
            "state": SUBMITTED,
            "where": f"Slurm {job_id}: submitted",
            "script": script.name,
        }
        write_json_atomic(run_dir / attempt_submitted(launch.attempt), ref)
        self.cache.jobs[job_id] = _Tracked()
        log.info("job %s: attempt %s submitted as Slurm job %s", launch.job_id, launch.attempt, job_id)
        return {"executor_ref": ref}

    # -- watching ------------------------------------------------------------------------------

    @staticmethod
    def slurm_id(job: Job) -> Optional[str]:
        value = (job.executor_ref or {}).get("slurm_job_id")
        return str(value) if value else None

    def refresh(self, jobs: Sequence[Job], now: float) -> None:
        tracked = {sid: job for job in jobs if (sid := self.slurm_id(job))}
        for sid in list(self.cache.jobs):
            if sid not in tracked:
                del self.cache.jobs[sid]
        if not tracked:
            return
        if now - self.cache.polled_at < self.cfg.poll_seconds and all(s in self.cache.jobs for s in tracked):
            self._read_exits(tracked)  # between polls: only the exit records (a stat each)
            self._publish(tracked, now)
            return
        self.cache.polled_at = now
        answers = self._squeue()
        self.cache.ok = answers is not None
        missing = []
        for sid, job in tracked.items():
            t = self.cache.jobs.setdefault(sid, _Tracked())
            if answers is None:
                continue  # unknown: keep the last answer
            if sid in answers:
                t.answer, t.gone = answers[sid], False
            elif (job.executor_ref or {}).get("submitted_at", 0) > now - 10:
                continue  # just submitted: squeue may not list it for a moment
            else:
                missing.append(sid)
        if missing and self._accounting_on():
            found = self._sacct(missing, tracked)
            for sid in missing:
                if found is None:
                    continue  # sacct did not answer: unknown
                t = self.cache.jobs[sid]
                if sid in found:
                    if t.answer is None or t.answer.state != found[sid].state:
                        log.info(
                            "job %s: Slurm job %s is no longer in squeue; sacct says %s",
                            tracked[sid].id,
                            sid,
                            found[sid].state,
                        )
                    t.answer, t.gone = found[sid], False
                else:
                    self._forget(
                        t,
                        sid,
                        tracked[sid],
                        "accounting does not know it either" if self.accounting else "accounting is off",
                    )
        elif missing:
            for sid in missing:
                self._forget(self.cache.jobs[sid], sid, tracked[sid], "accounting is off")
        for sid in tracked:
            t = self.cache.jobs[sid]
            if (t.gone or (t.answer is not None and t.answer.ended)) and t.ended_seen_at is None:
                t.ended_seen_at = now
        self._read_exits(tracked)
        self._publish(tracked, now)

    @staticmethod
    def _forget(t: _Tracked, sid: str, job: Job, why: str) -> None:
        if not t.gone:
            log.info("job %s: Slurm job %s is no longer in squeue and %s: its exit record decides", job.id, sid, why)
        t.gone = True

    def _read_exits(self, tracked: Mapping[str, Job]) -> None:
        """Every tick (a stat each, no exception when absent: 1,000 tracked jobs cost ~10 ms)."""
        runs = str(self.home.runs)
        for sid, job in tracked.items():
            t = self.cache.jobs.setdefault(sid, _Tracked())
            if t.exit_record is None and job.attempt:
                path = os.path.join(runs, str(job.id), attempt_exit(job.attempt))
                if os.path.exists(path):
                    t.exit_record = read_json(Path(path))

    def _publish(self, tracked: Mapping[str, Job], now: float) -> None:
        """Write what Slurm said into the job row's executor_ref when it changed, so `orch status`
        reads it from the store without asking Slurm."""
        for sid, job in tracked.items():
            t = self.cache.jobs[sid]
            text = self._describe(sid, t)
            if not text or text == (job.executor_ref or {}).get("where"):
                continue
            ref = dict(job.executor_ref or {})
            ref["where"] = text
            if t.answer is not None:
                ref.update(state=t.answer.state, reason=t.answer.reason, nodes=expand_nodelist(t.answer.nodes))
            try:
                self.store().update(job.id, now, only_if_state=[JobState.RUNNING], executor_ref=ref)
            except Exception as exc:  # the status line is a nicety; never let it stop the tick
                log.warning("job %s: could not record the Slurm state: %s", job.id, exc)

    def store(self):
        if self._store is None:
            from ..store import Store

            self._store = Store(self.home.db)
        return self._store

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

    def job_name(self, job_id: int, attempt: int) -> str:
        """orch-<home tag>-<job>.<attempt>: unique per ORCH_HOME, so two orch homes of one user on
        one cluster never mistake each other's jobs."""
        return f"orch-{self.tag}-{job_id}.{attempt}"

    def _find_by_name(self, job_id: int, attempt: int) -> Optional[str]:
        r = self._run(
            ["squeue", "-h", "-t", "all", "-u", self.user, f"--name={self.job_name(job_id, attempt)}", "-o", "%i"],
            what="squeue",
        )
        return (r.stdout.split() or [None])[0] if r is not None and r.returncode == 0 else None

    def alive(self, job: Job) -> bool:
        """Pending and running count; an ended job while its exit record may still be on the way;
        unknown always. False only when Slurm says it ended (or no longer knows it) and the wait for
        the exit record is over."""
        sid = self.slurm_id(job)
        if sid is None:
            return False
        t = self.cache.jobs.get(sid)
        if t is None or t.exit_record is not None:
            return t is None
        if t.ended_seen_at is None:
            return True
        if t.answer is not None and t.answer.state in INFRA_ENDS:
            return False  # no exit record will come: the node failed or Slurm took the job away
        return time.time() - t.ended_seen_at < EXIT_RECORD_WAIT_S

    def exit(self, job: Job) -> Optional[dict[str, Any]]:
        sid = self.slurm_id(job)
        t = self.cache.jobs.get(sid or "")
        if t is None:
            return read_json(self.home.run_dir(job.id) / attempt_exit(job.attempt)) if job.attempt else None
        if t.exit_record is None:
            if (
                t.ended_seen_at is not None
                and not t.gone
                and t.answer is not None
                and t.answer.ended
                and t.answer.state not in INFRA_ENDS
                and time.time() - t.ended_seen_at >= EXIT_RECORD_WAIT_S
            ):
                return self._exit_from_slurm(job, t)
            return None
        record = dict(t.exit_record)
        if t.answer is not None:
            record.setdefault("slurm_state", t.answer.state)
        return record

    def _exit_from_slurm(self, job: Job, t: _Tracked) -> Optional[dict[str, Any]]:
        """Slurm ended the job and the wrapper never wrote an exit record (it did not start, or
        was killed: a TIMEOUT the job ignored, an `scancel` from outside orch). Slurm's word is the
        exit, so the normal retry path decides, instead of a requeue loop."""
        a = t.answer
        assert a is not None
        code, sig = a.exit_code, a.exit_signal
        if code is None and sig is None:
            code, sig = (None, 15) if a.state == "CANCELLED" else (None, 9) if a.state == "TIMEOUT" else (1, None)
        now = time.time()
        record = exit_record(code, sig, now, now, slurm_state=a.state)
        log.warning(
            "job %s: Slurm job %s ended %s without an exit record; reading it as %s", job.id, a.job_id, a.state, record
        )
        with open(self.home.run_dir(job.id) / attempt_log(job.attempt), "a", encoding="utf-8") as f:
            f.write(f"[orch] Slurm ended job {a.job_id} as {a.state} before the job wrote its exit record\n")
        return record

    # -- signals -------------------------------------------------------------------------------

    def terminate(self, job: Job) -> bool:
        """ "Checkpoint now": SIGTERM to the job's srun tasks on every node (`scancel --signal=TERM`,
        no --full: that would make srun kill them). A pending job is simply cancelled."""
        sid = self.slurm_id(job)
        if sid is None:
            return False
        t = self.cache.jobs.get(sid)
        state = t.answer.state if t and t.answer else None
        if state in (None, "PENDING") and not self._started(job):
            r = self._run(["scancel", sid], what="scancel")
            if r is not None and r.returncode == 0:
                self._pending_exit(job, sid)
                return True
        self._run(["scancel", "--batch", "--signal=USR2", sid], what="scancel")  # "a stop was asked"
        r = self._run(["scancel", "--signal=TERM", sid], what="scancel")
        return r is not None and r.returncode == 0

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
        t = self.cache.jobs.get(sid)
        if t is not None:
            t.exit_record = read_json(path)

    def kill(self, job: Job) -> bool:
        """The grace is over: `scancel` (SIGTERM to every step and the batch script, SIGKILL after
        Slurm's KillWait). The wrapper still writes the exit record; the intent decides."""
        sid = self.slurm_id(job)
        if sid is None:
            return False
        r = self._run(["scancel", sid], what="scancel")
        return r is not None and r.returncode == 0

    def clear_lost(self, job: Job) -> None:
        """Lost (NODE_FAIL, preempted without answering, gone): make sure Slurm holds nothing of it."""
        sid = self.slurm_id(job)
        if sid is not None:
            t = self.cache.jobs.get(sid)
            if not (t and t.answer and t.answer.ended):
                self._run(["scancel", sid], what="scancel")

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

    def describe(self, job: Job) -> Optional[str]:
        t = self.cache.jobs.get(self.slurm_id(job) or "")
        return self._describe(self.slurm_id(job) or "", t) if t else (job.executor_ref or {}).get("where")

    @staticmethod
    def _describe(sid: str, t: _Tracked) -> str:
        if t.answer is None:
            return f"Slurm {sid}: gone from Slurm" if t.gone else ""
        return f"Slurm {sid}: {t.answer.describe()}"

    # -- Slurm commands ------------------------------------------------------------------------

    def _run(
        self,
        argv: list[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        what: str = "",
        timeout: float = QUERY_TIMEOUT_S,
    ) -> Optional[subprocess.CompletedProcess]:
        """A Slurm command; None when it could not run or did not answer in time (unknown)."""
        self.queries[what or argv[0]] = self.queries.get(what or argv[0], 0) + 1
        try:
            return subprocess.run(
                argv,
                env=dict(env or self.environ),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            if what == "sbatch":
                raise SlurmError(
                    f"{argv[0]} is not installed here (the daemon must run where Slurm's client "
                    "commands work, e.g. a login node)"
                ) from exc
            log.warning("%s: %s", argv[0], exc)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s did not answer: %s", argv[0], exc)
        return None

    def _squeue(self) -> Optional[dict[str, SlurmJob]]:
        r = self._run(["squeue", "-h", "-t", "all", "-u", self.user, "-o", SQUEUE_FORMAT], what="squeue")
        if r is None or r.returncode != 0:
            if r is not None:
                log.warning("squeue failed (rc %s): %s", r.returncode, (r.stderr or r.stdout).strip()[:300])
            return None
        return parse_squeue(r.stdout)

    def _accounting_on(self) -> bool:
        return self.accounting is not False

    def _sacct(self, ids: list[str], tracked: Mapping[str, Job]) -> Optional[dict[str, SlurmJob]]:
        since = min((tracked[s].executor_ref or {}).get("submitted_at") or time.time() for s in ids) - 86400
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
        r = self._run(
            ["sacct", "-X", "-n", "-P", "-j", ",".join(ids), f"--starttime={start}", "-o", SACCT_FIELDS], what="sacct"
        )
        if r is None:
            return None
        if r.returncode != 0:
            if accounting_disabled(r.stdout + r.stderr):
                if self.accounting is None:
                    log.info("Slurm accounting is off on this cluster: states come from squeue alone")
                self.accounting = False
                return {}  # nothing more to learn: squeue's silence is the answer
            log.warning("sacct failed (rc %s): %s", r.returncode, (r.stderr or r.stdout).strip()[:300])
            return None
        if self.accounting is None:
            self.accounting = True
        return parse_sacct(r.stdout)
