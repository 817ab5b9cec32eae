"""The Ray executor's view of its attempts: one list of the cluster's jobs per poll (the Jobs REST
API), cached for alive/exit/describe/billable, the exit records read from the shared run folders,
and the state published to the job row so `orch status` reads it without asking Ray.

How an attempt ends, read in this order:
- its exit record (written by ray/step.py on the node): the outcome table decides, as everywhere;
- Ray says FAILED because it lost the node or the job's supervisor (JOB_SUPERVISOR_ACTOR_DIED, a
  node-died message), or gave up waiting for resources (its start timeout): lost, requeued and
  resumed, not charged;
- Ray says it ended otherwise and no exit record came within EXIT_RECORD_WAIT_S: Ray's word is the
  exit (STOPPED = SIGTERM, so the intent decides; a runtime_env that cannot be set up = exit 1);
- the head does not answer: nothing ends; the daemon waits and says so, and the next answer
  reconciles every attempt."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from ...contract import (
    attempt_exit,
    attempt_log,
    attempt_ray_info,
    exit_record,
    ray_submission_id,
    read_json,
    write_json_atomic,
)
from ...home.paths import Home
from ...host.secret_file import remove_secret_file
from ...model.records import Job
from ...model.states import JobState
from .api import PENDING, RUNNING, STOPPED, RayJob, RayJobsApi, RayNode
from .wire import Heard, RayWire

if TYPE_CHECKING:
    from ...spec.ray_section import RaySection

log = logging.getLogger("orch.executor.ray")

EXIT_RECORD_WAIT_S = 15.0  # an ended job's exit record may be late on a network filesystem
UNSUBMITTED = "UNSUBMITTED"  # orch's own word: the head did not answer the submit yet


@dataclass
class Tracked:
    answer: Optional[RayJob] = None  # the last answer Ray gave about it
    ended_seen_at: Optional[float] = None  # the first poll that saw it ended (or gone)
    exit_record: Optional[dict[str, Any]] = None
    gone: bool = False  # the head answered and does not know it
    node_recorded: bool = False  # its Ray node id is in attempt-<n>.ray.json
    gpus: int = 0  # what it asked of Ray

    @property
    def holds_gpus(self) -> bool:
        """Submitted (or waiting to be) and not ended: its GPUs are taken, or about to be."""
        return not self.gone and not (self.answer is not None and self.answer.ended) and self.exit_record is None


def drain_notices(running: Mapping[str, RayJob], nodes: Sequence[RayNode]) -> dict[str, str]:
    """submission id -> the notice, for each running job whose node Ray marks draining."""
    draining = {n.node_id: n for n in nodes if n.draining}
    return {
        sid: (
            f"its Ray node {a.driver_node_id[:8]} ({draining[a.driver_node_id].address}) is draining "
            "(a preemption notice): checkpoint now, resume on another node"
        )
        for sid, a in running.items()
        if a.driver_node_id in draining
    }


class RayWatch:
    def __init__(self, home: Home, ray: "RaySection", api: Optional[RayJobsApi] = None):
        self.home, self.cfg = home, ray
        self.api = api or RayJobsApi(ray.address, ray.timeout_seconds, ray.submit_timeout_seconds)
        self.wire = RayWire(self.api, ray)  # every call to the head, off the tick's lock (ray/wire.py)
        self.jobs: dict[str, Tracked] = {}
        self.unreachable_since: Optional[float] = None
        self.unreachable_why = ""
        self.notices: dict[str, str] = {}  # submission id -> why its node is going away (a drain)
        self._store: Any = None

    @staticmethod
    def sid(job: Job) -> Optional[str]:
        if not job.attempt:
            return None
        return str((job.executor_ref or {}).get("submission_id") or ray_submission_id(job.uid, job.attempt))

    def exchange(self, jobs: Sequence[Job], now: float) -> None:
        """The network half, off the tick's lock: the submits and stops asked, then a look."""
        self.wire.exchange({sid: job for job in jobs if (sid := self.sid(job))}, now)

    def refresh(self, jobs: Sequence[Job], now: float) -> None:
        """What the last exchange heard, applied (no call to the head here: the tick's lock is held)."""
        tracked = {sid: job for job in jobs if (sid := self.sid(job))}
        for sid in list(self.jobs):
            if sid not in tracked:
                del self.jobs[sid]
        heard = self.wire.take_heard()
        if tracked and heard is not None:
            self._apply(heard, tracked)
        for sid, job in tracked.items():
            self.jobs.setdefault(sid, Tracked()).gpus = job.gpus
        self._read_exits(tracked)
        self._publish(tracked, now)

    def _apply(self, heard: Heard, tracked: Mapping[str, Job]) -> None:
        now = heard.at
        if heard.answers is None:
            if self.unreachable_since is None:
                self.unreachable_since = now
                log.warning("%s: its attempts are left as they are until it answers", heard.why)
            self.unreachable_why = heard.why
            for sid in tracked:
                self.jobs.setdefault(sid, Tracked())
            return
        answers = heard.answers
        if self.unreachable_since is not None:
            log.info("the Ray head answers again after %.0fs: reconciling every attempt", now - self.unreachable_since)
        self.unreachable_since = None
        for sid, job in tracked.items():
            t = self.jobs.setdefault(sid, Tracked())
            if sid in answers:
                t.answer, t.gone = answers[sid], False
            elif self.wire.waiting(sid):
                continue  # not submitted yet: the next exchange sends it again
            elif not t.gone:
                log.info("job %s: Ray does not know %s (the head lost its jobs?)", job.id, sid)
                t.gone = True
            if (t.gone or (t.answer is not None and t.answer.ended)) and t.ended_seen_at is None:
                t.ended_seen_at = now
        running = {sid: a for sid, a in answers.items() if sid in self.jobs and a.status == RUNNING}
        if not running:
            self.notices = {}
        elif heard.nodes is not None:  # cannot tell: the last answer stands (never a notice from silence)
            self.notices = drain_notices(running, heard.nodes)

    def _read_exits(self, tracked: Mapping[str, Job]) -> None:
        runs = str(self.home.runs)
        for sid, job in tracked.items():
            t = self.jobs.setdefault(sid, Tracked())
            if t.exit_record is None:
                path = os.path.join(runs, str(job.id), attempt_exit(job.attempt))
                if os.path.exists(path):
                    t.exit_record = read_json(Path(path))
            if t.exit_record is not None or t.gone or (t.answer is not None and t.answer.ended):
                # Ended, or never to start: its secret file goes (the step deletes it when it reads
                # it; this is for a step that never ran: stopped while pending, refused, lost)
                remove_secret_file(Path(runs) / str(job.id), job.attempt)

    # -- what the tick asks ----------------------------------------------------------------------

    def alive(self, job: Job) -> bool:
        """Pending and running count, and so does "cannot tell" (the head unreachable). False when
        Ray lost it, or when it ended and the wait for its exit record is over."""
        t = self.jobs.get(self.sid(job) or "")
        if t is None:
            return self.sid(job) is not None and self.exit(job) is None
        if t.exit_record is not None:
            return False
        if t.ended_seen_at is None:
            return True
        if t.answer is not None and t.answer.machine_lost and not t.gone:
            return False  # no exit record will come: the node or the job's supervisor is gone
        return time.time() - t.ended_seen_at < EXIT_RECORD_WAIT_S

    def exit(self, job: Job) -> Optional[dict[str, Any]]:
        t = self.jobs.get(self.sid(job) or "")
        if t is None:
            return read_json(self.home.run_dir(job.id) / attempt_exit(job.attempt)) if job.attempt else None
        if t.exit_record is not None:
            return {**t.exit_record, **({"ray_status": t.answer.status} if t.answer else {})}
        a = t.answer
        if (
            a is not None
            and not t.gone
            and a.ended
            and not a.machine_lost
            and t.ended_seen_at is not None
            and time.time() - t.ended_seen_at >= EXIT_RECORD_WAIT_S
        ):
            return self._exit_from_ray(job, a)
        return None

    def _exit_from_ray(self, job: Job, a: RayJob) -> dict[str, Any]:
        """Ray ended the job and no exit record came (it never started: a runtime_env that cannot
        be set up; stopped from outside orch): Ray's word is the exit, so the retry rules decide."""
        code, sig = (None, 15) if a.status == STOPPED else (a.driver_exit_code or 1, None)
        now = time.time()
        why = f"Ray ended {a.submission_id} as {a.status}" + (f" ({a.error_type})" if a.error_type else "")
        with open(self.home.run_dir(job.id) / attempt_log(job.attempt), "a", encoding="utf-8") as f:
            f.write(f"[orch] {why} before the job wrote its exit record: {a.message[:2000]}\n")
        log.warning("job %s: %s without an exit record; reading it as code %s signal %s", job.id, why, code, sig)
        return exit_record(code, sig, a.start_time or now, a.end_time or now, ray_status=a.status)

    def cluster_gpus(self) -> Optional[tuple[float, float]]:
        return self.wire.usage

    def gpu_room(self, now: float) -> Optional[tuple[int, str]]:
        """The cluster's free GPUs for new attempts: what Ray reports free, less what orch's own
        attempts hold or are about to (submitted, or waiting to be, and not yet in Ray's figures),
        so a job waits in orch's queue (visible, cancellable) instead of as a PENDING Ray job.
        "Cannot tell" (the head does not answer) is no room. With the autoscaler the cluster grows
        on demand: no limit here ([ray] max_gpus still caps what orch submits). Ray's figures are
        the last exchange's (off the lock); asking here has the next one look again."""
        if self.cfg.autoscaler:
            return None
        self.wire.usage_wanted = True
        usage = self.wire.usage
        if usage is None:
            why = self.wire.usage_why or f"the Ray head at {self.cfg.address} has not reported its GPUs yet"
            return 0, f"waiting for the Ray head: {why}"
        used, total = usage
        ours = sum(t.gpus for t in self.jobs.values() if t.holds_gpus)
        busy = max(used, float(ours))
        free = max(0, int(total - busy))
        return free, f"waiting for a free GPU on the Ray cluster ({busy:g} of {total:g} in use)"

    def notice(self, job: Job) -> Optional[str]:
        """Why the attempt must checkpoint now: its node is draining (a spot preemption)."""
        return self.notices.get(self.sid(job) or "")

    def billable(self, job: Job) -> bool:
        """Charged while Ray runs it (its GPUs are held): pending costs nothing."""
        t = self.jobs.get(self.sid(job) or "")
        return bool(t and t.answer and t.answer.status == RUNNING and t.exit_record is None)

    def describe(self, job: Job) -> Optional[str]:
        sid = self.sid(job) or ""
        t = self.jobs.get(sid)
        return self._describe(job, sid, t) if t else (job.executor_ref or {}).get("where")

    def _describe(self, job: Job, sid: str, t: Tracked) -> str:
        if self.wire.waiting(sid):
            return f"Ray {sid}: not submitted yet: {self.unreachable_why or 'on its way to the head'}"
        if t.answer is None:
            return f"Ray {sid}: gone from Ray" if t.gone else f"Ray {sid}: submitted"
        a = t.answer
        text = f"Ray {sid}: {a.status}"
        if a.status == PENDING:
            text += f" (waiting for {job.gpus} GPU{'s' if job.gpus != 1 else ''})" if job.gpus else " (waiting)"
        elif a.status == RUNNING:
            info = read_json(self.home.run_dir(job.id) / attempt_ray_info(job.attempt)) or {}
            node = (a.driver_node_id or info.get("node_id") or "")[:8]
            text += f" on node {node}" + (f" ({info['host']})" if info.get("host") else "") if node else ""
        elif a.error_type:
            text += f" ({a.error_type})"
        if self.unreachable_since is not None:
            text += (
                f"; the head does not answer since {time.strftime('%H:%M:%S', time.localtime(self.unreachable_since))}"
            )
        return text

    def _publish(self, tracked: Mapping[str, Job], now: float) -> None:
        """What Ray said, into the job row's executor_ref when it changed."""
        for sid, job in tracked.items():
            self._record_node(job, self.jobs[sid])
            text = self._describe(job, sid, self.jobs[sid])
            ref = dict(job.executor_ref or {})
            if not ref or text == ref.get("where"):
                continue  # no handle recorded yet: the start records it
            ref["where"] = text
            a = self.jobs[sid].answer
            if a is not None:
                ref.update(state=a.status, node_id=a.driver_node_id)
            try:
                self.store().update(job.id, now, only_if_state=[JobState.RUNNING], executor_ref=ref)
            except Exception as exc:  # the status line is a nicety; never let it stop the tick
                log.warning("job %s: could not record the Ray state: %s", job.id, exc)

    def _record_node(self, job: Job, t: Tracked) -> None:
        """The Ray node id into attempt-<n>.ray.json, once: the step on the node cannot learn it
        without importing ray, and `orch show` names each attempt's node after it ended."""
        node = t.answer.driver_node_id if t.answer is not None else ""
        if not node or t.node_recorded:
            return
        path = self.home.run_dir(job.id) / attempt_ray_info(job.attempt)
        info = read_json(path)
        if info is None:
            return  # the step has not started yet: the next poll looks again
        if info.get("node_id") != node:
            try:
                write_json_atomic(path, {**info, "node_id": node})
            except OSError as exc:
                log.warning("job %s: could not record its Ray node in %s: %s", job.id, path, exc)
                return
        t.node_recorded = True

    def store(self) -> Any:
        if self._store is None:
            from ...store import Store

            self._store = Store(self.home.db)
        return self._store
