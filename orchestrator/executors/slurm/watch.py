"""The Slurm executor's view of its attempts: one batched `squeue` per poll (and `sacct` for the ones
squeue forgot), cached for alive/exit/describe, the exit records read, the state published to the store.

The commands run in `exchange`, off the daemon's tick lock (daemon/executor_io.py): the queued
`scancel`s first, then the look. `refresh`, under the lock, applies what the last exchange heard: a
slurmctld that does not answer holds the exchange's thread, never the lock a notice needs."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from ...contract import attempt_exit, attempt_log, exit_record, read_json
from ...home.paths import Home
from ...host.secret_file import remove_secret_file
from ...model.records import Job
from ...model.states import JobState
from .commands import SlurmCommands, log
from .query import INFRA_ENDS, SlurmJob, expand_nodelist
from .submit import SUBMITTING, Submits, handle_on_disk, key_of, send

if TYPE_CHECKING:
    from ...spec.config import SlurmSection


# An ended job whose exit record is not visible yet (NFS attribute caching) is given this long.
EXIT_RECORD_WAIT_S = 15.0


@dataclass
class Tracked:
    answer: Optional[SlurmJob] = None  # the last answer Slurm gave about it
    ended_seen_at: Optional[float] = None  # first poll that saw it ended (or gone)
    exit_record: Optional[dict[str, Any]] = None
    gone: bool = False  # squeue (and sacct, when on) no longer know it
    described: str = ""


@dataclass
class SlurmCache:
    polled_at: float = 0.0  # the last look (the exchange's own)
    ok: bool = False  # the last squeue answered
    jobs: dict[str, Tracked] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)  # the Slurm ids the last look was about


@dataclass(frozen=True)
class Heard:
    """One look: squeue's answers (None: no answer); the ids it did not list (past the grace of a
    fresh submit), and what sacct said of them (None: not asked, or no answer)."""

    at: float
    answers: Optional[dict[str, SlurmJob]]
    missing: list[str]
    found: Optional[dict[str, SlurmJob]]
    asked_sacct: bool


@dataclass
class Cancel:
    argv: list[str]
    # Told whether scancel took it, once it ran (a pending job's exit record is written then).
    then: Optional[Callable[[bool], None]] = None


class SlurmWatch(SlurmCommands):
    """State: the cache of Slurm's answers per tracked attempt, refreshed at most once per poll."""

    def __init__(self, home: Home, slurm: "SlurmSection", *, environ: Optional[Mapping[str, str]] = None):
        super().__init__(home, slurm, environ=environ)
        self.cache = SlurmCache()
        self._store = None
        self._mu = threading.Lock()  # between the tick and the exchange: the cancels, the answers
        self._cancels: list[Cancel] = []
        self._heard: Optional[Heard] = None
        self.submits = Submits()  # the sbatches, off the lock too (slurm/submit.py)

    @staticmethod
    def slurm_id(job: Job) -> Optional[str]:
        value = (job.executor_ref or {}).get("slurm_job_id")
        return str(value) if value else None

    def ask_cancel(self, cancel: Cancel) -> None:
        """An `scancel` for the next exchange (never run under the tick's lock)."""
        with self._mu:
            self._cancels.append(cancel)

    def exchange(self, jobs: Sequence[Job], now: float) -> None:
        """Off the tick's lock: the scancels asked, then one squeue (each poll_seconds, or at once
        for a new attempt) and sacct for the attempts squeue no longer lists."""
        orphans = [j for j in jobs if self.slurm_id(j) is None and self._orphan(j)]
        send(self.submits, self._run, self._find_by_name, orphans)
        with self._mu:
            cancels, self._cancels = self._cancels, []
        for cancel in cancels:
            r = self._run(cancel.argv, what="scancel")
            if cancel.then is not None:
                cancel.then(r is not None and r.returncode == 0)
        tracked = {sid: job for job in jobs if (sid := self.slurm_id(job))}
        if not tracked:
            return
        if now - self.cache.polled_at < self.cfg.poll_seconds and set(tracked) <= self.cache.known:
            return
        self.cache.polled_at, self.cache.known = now, set(tracked)
        answers = self._squeue()
        missing = []
        if answers is not None:
            missing = [
                sid
                for sid, job in tracked.items()
                if sid not in answers and (job.executor_ref or {}).get("submitted_at", 0) <= now - 10
            ]  # one just submitted: squeue may not list it for a moment
        found, asked = None, False
        if missing and self._accounting_on():
            found, asked = self._sacct(missing, tracked), True
        with self._mu:
            self._heard = Heard(now, answers, missing, found, asked)

    def _orphan(self, job: Job) -> bool:
        """Recorded as submitting, and neither queued here nor known: a daemon died meanwhile."""
        key = key_of(job)
        with self.submits.mu:
            if key in self.submits.queued or key in self.submits.sending or key in self.submits.handles:
                return False
            if key in self.submits.unknown:
                return False
        state = (job.executor_ref or {}).get("state")
        return state == SUBMITTING and handle_on_disk(self.home.run_dir(job.id), job.attempt) is None

    def _recorded(self, jobs: Sequence[Job], now: float) -> list[Job]:
        """The jobs, with the Slurm ids the exchange learnt recorded on their rows (a stop asked
        before the id was known goes out now)."""
        out = []
        for job in jobs:
            if self.slurm_id(job) is None and job.attempt:
                with self.submits.mu:
                    ref = self.submits.handles.pop(key_of(job), None)
                ref = ref or handle_on_disk(self.home.run_dir(job.id), job.attempt)
                if ref is not None:
                    try:
                        self.store().update(job.id, now, only_if_state=[JobState.RUNNING], executor_ref=ref)
                    except Exception as exc:  # the file stays: the next refresh records it
                        log.warning("job %s: could not record Slurm job %s: %s", job.id, ref["slurm_job_id"], exc)
                    job = replace(job, executor_ref=ref)
                    with self.submits.mu:
                        stop = key_of(job) in self.submits.stop_asked
                        self.submits.stop_asked.discard(key_of(job))
                    if stop:
                        self.terminate(job)
            out.append(job)
        return out

    def terminate(self, job: Job) -> bool:  # the executor's (slurm.py)
        raise NotImplementedError

    def refresh(self, jobs: Sequence[Job], now: float) -> None:
        """What the last exchange heard, applied; the exit records read (a stat each). No command."""
        jobs = self._recorded(jobs, now)
        tracked = {sid: job for job in jobs if (sid := self.slurm_id(job))}
        for sid in list(self.cache.jobs):
            if sid not in tracked:
                del self.cache.jobs[sid]
        with self._mu:
            heard, self._heard = self._heard, None
        if tracked and heard is not None:
            self._apply(heard, tracked)
        for sid in tracked:
            self.cache.jobs.setdefault(sid, Tracked())
        self._read_exits(tracked)
        self._publish(tracked, now)

    def _apply(self, heard: Heard, tracked: Mapping[str, Job]) -> None:
        now, answers = heard.at, heard.answers
        self.cache.ok = answers is not None
        for sid in tracked:
            t = self.cache.jobs.setdefault(sid, Tracked())
            if answers is not None and sid in answers:
                t.answer, t.gone = answers[sid], False
        missing = [sid for sid in heard.missing if sid in tracked]
        if missing and heard.asked_sacct:
            for sid in missing:
                if heard.found is None:
                    continue  # sacct did not answer: unknown
                t = self.cache.jobs[sid]
                if sid in heard.found:
                    if t.answer is None or t.answer.state != heard.found[sid].state:
                        log.info(
                            "job %s: Slurm job %s is no longer in squeue; sacct says %s",
                            tracked[sid].id,
                            sid,
                            heard.found[sid].state,
                        )
                    t.answer, t.gone = heard.found[sid], False
                else:
                    self._forget(
                        t,
                        sid,
                        tracked[sid],
                        "accounting does not know it either" if self.accounting else "accounting is off",
                    )
        else:
            for sid in missing:
                self._forget(self.cache.jobs[sid], sid, tracked[sid], "accounting is off")
        for sid in tracked:
            t = self.cache.jobs[sid]
            if (t.gone or (t.answer is not None and t.answer.ended)) and t.ended_seen_at is None:
                t.ended_seen_at = now

    @staticmethod
    def _forget(t: Tracked, sid: str, job: Job, why: str) -> None:
        if not t.gone:
            log.info("job %s: Slurm job %s is no longer in squeue and %s: its exit record decides", job.id, sid, why)
        t.gone = True

    def _read_exits(self, tracked: Mapping[str, Job]) -> None:
        """Every tick (a stat each, no exception when absent: 1,000 tracked jobs cost ~10 ms)."""
        runs = str(self.home.runs)
        for sid, job in tracked.items():
            t = self.cache.jobs.setdefault(sid, Tracked())
            if t.exit_record is None and job.attempt:
                path = os.path.join(runs, str(job.id), attempt_exit(job.attempt))
                if os.path.exists(path):
                    t.exit_record = read_json(Path(path))
            if job.attempt and (t.exit_record is not None or t.gone or (t.answer is not None and t.answer.ended)):
                # Ended, or never to start: its secret file goes (the batch step deletes it when it
                # reads it; this is for one that never ran: cancelled while pending, lost)
                remove_secret_file(Path(runs) / str(job.id), job.attempt)

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
            from ...store import Store

            self._store = Store(self.home.db)
        return self._store

    def alive(self, job: Job) -> bool:
        """Pending and running count; an ended job while its exit record may still be on the way;
        unknown always. False only when Slurm says it ended (or no longer knows it) and the wait for
        the exit record is over."""
        sid = self.slurm_id(job)
        if sid is None:
            return self._submitting(job)
        t = self.cache.jobs.get(sid)
        if t is None or t.exit_record is not None:
            return t is None
        if t.ended_seen_at is None:
            return True
        if t.answer is not None and t.answer.state in INFRA_ENDS:
            return False  # no exit record will come: the node failed or Slurm took the job away
        return time.time() - t.ended_seen_at < EXIT_RECORD_WAIT_S

    def _submitting(self, job: Job) -> bool:
        """No Slurm id recorded yet: alive while its sbatch is queued, on its way or just taken,
        or until a look by name says Slurm never had it."""
        key = key_of(job)
        with self.submits.mu:
            if key in self.submits.queued or key in self.submits.sending or key in self.submits.handles:
                return True
            if key in self.submits.unknown:
                return False
        if not job.attempt or handle_on_disk(self.home.run_dir(job.id), job.attempt) is not None:
            return bool(job.attempt)
        return (job.executor_ref or {}).get("state") == SUBMITTING  # the next exchange looks it up by name

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

    def _exit_from_slurm(self, job: Job, t: Tracked) -> Optional[dict[str, Any]]:
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

    def describe(self, job: Job) -> Optional[str]:
        t = self.cache.jobs.get(self.slurm_id(job) or "")
        return self._describe(self.slurm_id(job) or "", t) if t else (job.executor_ref or {}).get("where")

    @staticmethod
    def _describe(sid: str, t: Tracked) -> str:
        if t.answer is None:
            return f"Slurm {sid}: gone from Slurm" if t.gone else ""
        return f"Slurm {sid}: {t.answer.describe()}"
