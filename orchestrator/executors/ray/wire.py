"""The Ray executor's network half: every call to the head (a submit, a stop, the list of jobs,
the nodes, the GPU usage) is made here, in `exchange`, which the daemon runs on its own thread
off the tick's lock, with a bound (daemon/executor_io.py). The tick's side (ray/executor.py, ray/watch.py)
only asks — a submit or a stop queued here — and reads what the last exchange heard. So a head that
accepts a request and never answers holds this thread, never the lock a preemption notice needs to
SIGTERM the jobs the daemon can reach (issue 44).

Between the two sides only a few fields pass, each under `_mu` and never across a call: the
submits waiting (`unsubmitted`), the stops asked, the newest answers (`Heard`) and the usage."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from ...contract import EX_CONFIG, JOB_ERROR, attempt_log, write_exit_record, write_json_atomic
from ...host.secret_file import remove_secret_file
from .api import RUNNING, RayJob, RayJobsApi, RayNode, RayRefused, RayUnreachable

if TYPE_CHECKING:
    from ...spec.ray_section import RaySection

log = logging.getLogger("orch.executor.ray")


@dataclass
class Submit:
    """One attempt to hand to Ray, as the tick's start left it."""

    body: dict[str, Any]
    job_id: int
    attempt: int
    run_dir: Path
    gpus: int
    told_waiting: bool = False  # its log says it waits for the head (said once)


@dataclass
class Stop:
    sid: str
    job_id: int
    # Run once Ray took the stop: a job that never started gets its exit record here.
    then: Optional[Callable[[], None]] = None


@dataclass(frozen=True)
class Heard:
    """What one exchange heard: the cluster's jobs (None: the head did not answer, `why`) and, while
    some of them run, its nodes (None: not asked, or no answer: the last drain state stands)."""

    at: float
    answers: Optional[dict[str, RayJob]]
    why: str = ""
    nodes: Optional[list[RayNode]] = None


def note(run_dir: Path, attempt: int, text: str) -> None:
    """One line in the attempt's log, so `orch logs` and the failure notice say why."""
    with open(run_dir / attempt_log(attempt), "a", encoding="utf-8") as f:
        f.write(f"[orch] attempt {attempt} on Ray: {text}\n")


@dataclass
class RayWire:
    api: RayJobsApi
    cfg: "RaySection"
    unsubmitted: dict[str, Submit] = field(default_factory=dict)  # submission id -> to send (again)
    stops: list[Stop] = field(default_factory=list)
    heard: Optional[Heard] = None  # the newest answers the tick has not applied yet
    usage: Optional[tuple[float, float]] = None  # (GPUs in use, GPUs in all), Ray's last word
    usage_why: str = ""  # why the usage is not known
    usage_wanted: bool = True  # the dispatch asked for it since the last look
    exchanges: int = 0  # finished exchanges (tests wait on it)
    _polled_at: float = 0.0
    _usage_at: float = 0.0
    _known: set[str] = field(default_factory=set)  # the submission ids the last poll was about
    _mu: threading.Lock = field(default_factory=threading.Lock)

    # -- the tick's side: ask, never wait ---------------------------------------------------------

    def ask_submit(self, sid: str, submit: Submit) -> None:
        with self._mu:
            self.unsubmitted[sid] = submit

    def forget_submit(self, sid: str) -> bool:
        """Drop a submit not sent yet (the attempt was stopped first). True: it was waiting."""
        with self._mu:
            return self.unsubmitted.pop(sid, None) is not None

    def waiting(self, sid: str) -> bool:
        with self._mu:
            return sid in self.unsubmitted

    def ask_stop(self, stop: Stop) -> None:
        with self._mu:
            self.stops.append(stop)

    def take_heard(self) -> Optional[Heard]:
        with self._mu:
            heard, self.heard = self.heard, None
        return heard

    # -- the exchange: off the tick's lock --------------------------------------------------------

    def exchange(self, tracked: Mapping[str, Any], now: float) -> None:
        """Send the stops, then the submits, then look: the jobs (every poll_seconds, or at once
        when an attempt is new), the nodes while some run, the GPU usage when the dispatch asked."""
        with self._mu:
            stops, self.stops = self.stops, []
            submits = {sid: s for sid, s in self.unsubmitted.items() if sid in tracked}
        for stop in stops:
            self._stop(stop)
        for sid, submit in submits.items():
            self._submit(sid, submit)
        if submits or stops or now - self._polled_at >= self.cfg.poll_seconds or set(tracked) - self._known:
            self._polled_at, self._known = now, set(tracked)
            if tracked:
                self._poll(now)
        if not self.cfg.autoscaler and self.usage_wanted and now - self._usage_at >= self.cfg.poll_seconds:
            self._usage_at, self.usage_wanted = now, False
            try:
                self.usage, self.usage_why = self.api.gpu_usage(), ""
            except OSError as exc:
                self.usage, self.usage_why = None, str(exc)
        self.exchanges += 1

    def _poll(self, now: float) -> None:
        try:
            answers = self.api.jobs()
        except RayUnreachable as exc:
            self._hear(Heard(now, None, str(exc)))
            return
        nodes = None
        if any(a.status == RUNNING for sid, a in answers.items() if sid in self._known):
            try:
                nodes = self.api.nodes()
            except OSError as exc:  # cannot tell: the last drain state stands (never a notice from silence)
                log.debug("cannot read the Ray nodes' drain state: %s", exc)
        self._hear(Heard(now, answers, nodes=nodes))

    def _hear(self, heard: Heard) -> None:
        with self._mu:
            self.heard = heard

    def _stop(self, stop: Stop) -> None:
        try:
            self.api.stop(stop.sid)
        except OSError as exc:
            log.warning(
                "job %s: cannot stop Ray job %s: %s (the grace's backstop tries again)", stop.job_id, stop.sid, exc
            )
            return
        if stop.then is not None:
            stop.then()

    def _submit(self, sid: str, s: Submit) -> None:
        """One submit, the same submission id every time (Ray never runs one twice: a job it has
        under that id is adopted, ray_api.submit). No answer: it waits here and goes again."""
        try:
            too_big = self._fits_no_node(s.gpus)
            if too_big:
                self._done(sid)
                remove_secret_file(s.run_dir, s.attempt)
                refuse(s, too_big)
                return
            self.api.submit(s.body)
        except RayUnreachable as exc:
            if not s.told_waiting:
                s.told_waiting = True
                note(s.run_dir, s.attempt, f"not submitted yet: {exc}; orch submits it when the head answers")
            return
        except RayRefused as exc:  # it answers, and says no: the attempt ends with why (exit 127)
            self._done(sid)
            remove_secret_file(s.run_dir, s.attempt)
            note(s.run_dir, s.attempt, f"Ray refused the job: {exc}")
            now = time.time()
            write_exit_record(s.run_dir, s.attempt, 127, None, now, now, ray_status="NOT SUBMITTED")
            return
        if not self._done(sid):  # stopped while the submit was on its way: Ray must not keep it
            self._stop(Stop(sid, s.job_id))
            return
        log.info("job %s: attempt %s submitted to Ray as %s", s.job_id, s.attempt, sid)

    def _done(self, sid: str) -> bool:
        """The submit is settled; False when the tick dropped it meanwhile (the attempt stopped)."""
        with self._mu:
            return self.unsubmitted.pop(sid, None) is not None

    def _fits_no_node(self, gpus: int) -> Optional[str]:
        """Why no node of the cluster can ever hold the job (a fixed cluster: no autoscaler)."""
        if not gpus or self.cfg.autoscaler:
            return None
        nodes = [n for n in self.api.nodes() if n.alive]
        most = max((n.gpus for n in nodes), default=0.0)
        if gpus <= most:
            return None
        return (
            f"asks for {gpus} GPUs on one node, but the largest node of the Ray cluster at {self.cfg.address} "
            f"has {most:g}; lower `gpus`, or add bigger nodes (set [ray] autoscaler = true if the cluster "
            "grows on demand)"
        )


def refuse(s: Submit, why: str) -> None:
    """A job no node can hold fails at once with the reason (exit 78: not retried)."""
    note(s.run_dir, s.attempt, why)
    write_json_atomic(s.run_dir / JOB_ERROR, {"attempt": s.attempt, "message": why})
    now = time.time()
    write_exit_record(s.run_dir, s.attempt, EX_CONFIG, None, now, now, ray_status="NOT SUBMITTED")
