"""`orch daemon run`: the lock, logging, APScheduler driving the daemon's periodic work (tick,
preemption watch, outbox, idle check), the wake socket that makes a submit or a finished job act
at once instead of at the next tick, and the orderly stop on SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import logging.handlers
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Optional

from ..jobs.attempts import grace_for
from ..jobs.lifecycle import machine_outgoing
from ..jobs import preflight_server
from ..spec.config import Config, preemption_file
from ..home.daemon_lock import DaemonLock
from ..home.paths import Home
from ..home.wake import COUNTERS, WARM_PREFLIGHT, answer_counters, listen
from ..model.states import EventKind, JobState, notice_detail
from ..store import Store
from .tick import Daemon

log = logging.getLogger("orch.daemon")


def setup_logging(home: Home, config: Config, detached: bool) -> None:
    root = logging.getLogger("orch")
    root.setLevel(logging.INFO)
    root.handlers.clear()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = logging.handlers.RotatingFileHandler(
        home.log_file, maxBytes=int(config.daemon.log_max_mb * 1e6), backupCount=config.daemon.log_backups
    )
    handler.setFormatter(fmt)
    root.addHandler(handler)
    if not detached:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(fmt)
        root.addHandler(stream)


class DaemonRuntime:
    """Owns the threads around a Daemon: scheduler, wake listener, notice watcher, outbox, hooks."""

    def __init__(self, home: Home, config: Config, store: Store):
        from .hooks import HookRunner
        from ..jobs.outbox import OutboxSender
        from .notice_watch import NoticeWatcher
        from .preemption import build_sources

        self.home, self.config, self.store = home, config, store
        self.hooks = HookRunner(
            config.hooks.model_extra or {},
            log=logging.getLogger("orch.hooks"),
            timeout_s=config.hooks.timeout_seconds,
            cwd=home.root,
        )
        self.daemon = Daemon(home, config, store, on_event=self._on_event)
        self.sender = OutboxSender.from_config(store, config)
        p = config.preemption
        self.watcher = NoticeWatcher(
            build_sources(
                p.sources,
                aws_endpoint=p.aws_endpoint,
                gcp_endpoint=p.gcp_endpoint,
                azure_endpoint=p.azure_endpoint,
                file_path=preemption_file(config, home.root),
                timeout_s=p.timeout_seconds,
            )
        )
        self.stop_event = threading.Event()
        self.exit_after_notice = False
        self.wake_pending = threading.Event()
        self.deliver_lock = threading.Lock()
        self.idle = IdleShutdown(self)
        self.scheduler: Any = None
        from .mirror import build_mirror

        self.mirror = build_mirror(self)  # [storage]: the uploader; None without a url
        self.warm_preflight: Optional[subprocess.Popen[bytes]] = None
        self._preflight_lock = threading.Lock()  # the wake thread starts it, the scheduler restarts it

    def _on_event(self, kind: str, job: Any) -> None:
        info = None
        if job is not None:
            info = {
                "id": job.id,
                "name": job.name,
                "state": job.state.value,
                "cost": job.cost,
                "attempt": job.shown_attempt,
                "run_dir": str(self.home.run_dir(job.id)),
            }
        self.hooks.submit_event(kind, info)

    # -- scheduled work ------------------------------------------------------------------------

    def tick(self) -> None:
        from ..home.drain import requested

        draining = requested(self.home) is not None
        if draining and not self.daemon.stopping:
            log.info("drain requested: the running jobs finish, nothing new starts, then the daemon exits")
        self.daemon.stopping = self.daemon.stopping or draining  # no dispatch from now on
        # A wake that arrives while a tick runs is not lost: run again until none is pending.
        for _ in range(10):
            self.wake_pending.clear()
            try:
                self.daemon.tick(time.time())
                self.idle.check(time.time())
            except Exception:
                log.exception("tick failed; the daemon goes on")
            if not self.wake_pending.is_set():
                break
        if draining and self.daemon.running_count() == 0 and not self.stop_event.is_set():
            from ..home.drain import clear

            log.info("drained: no job is running; exiting")
            clear(self.home)
            self.stop_event.set()
        if self.exit_after_notice and self.daemon.running_count() == 0:
            log.info(
                "preemption notice: every job checkpointed and requeued; exiting as [preemption] on_notice = 'exit'"
            )
            self.stop_event.set()

    def watch(self) -> None:
        try:
            notices = self.watcher.poll_all(time.time())
        except Exception:
            log.exception("preemption watch failed")
            return
        now = time.time()
        for notice in notices:
            said = notice_detail(notice.source, notice.kind, notice.detail)
            self.store.record_event(
                None,
                EventKind.NOTICE,
                now,
                detail=said,
                outgoing=machine_outgoing(self.config, EventKind.NOTICE, said),
            )
            self.hooks.submit_event(EventKind.NOTICE.value, None)
            if notice.stops_jobs:
                log.warning(
                    "preemption notice from %s: %s; checkpointing every running job", notice.source, notice.detail
                )
                self.daemon.preempt_all(now, f"preemption notice ({notice.source}): {notice.detail}")
                if self.mirror is not None:
                    self.mirror.on_notice()
                if self.config.preemption.on_notice == "exit":
                    self.exit_after_notice = True
        was = self.daemon.notice_active
        self.daemon.notice_active = self.watcher.notice_active
        if was and not self.daemon.notice_active:
            log.info("preemption notice cleared; dispatching again")
            if self.mirror is not None:
                self.mirror.urgent = False
        if notices:
            self.poke()

    def deliver(self) -> None:
        # The idle check calls this from the tick thread too: one pass at a time, or a row
        # could go out twice.
        if not self.deliver_lock.acquire(blocking=False):
            return
        try:
            self.sender.deliver_due(time.time())
        except Exception:
            log.exception("outbox delivery failed; will retry")
        finally:
            self.deliver_lock.release()

    def poke(self) -> None:
        self.wake_pending.set()
        if self.scheduler is not None:
            try:
                self.scheduler.modify_job("tick", next_run_time=datetime.now(timezone.utc))
            except Exception:  # the scheduler is shutting down
                pass

    # -- life cycle ----------------------------------------------------------------------------

    def run(self) -> int:
        from apscheduler.schedulers.background import BackgroundScheduler

        from ..home.drain import clear, requested

        if requested(self.home) is not None:
            log.info("a drain request left by an earlier daemon is dropped: this one runs the queue")
            clear(self.home)

        self.daemon.recover(time.time())
        sock = listen(self.home.wake_socket)
        sock.settimeout(1.0)
        # the pre-flight kept warm for `orch submit`, in this interpreter: started at the first
        # built-in submit this daemon hears of (wake.WARM_PREFLIGHT), a new one per daemon
        threading.Thread(target=self._listen_loop, args=(sock,), daemon=True, name="wake").start()
        sched = BackgroundScheduler(
            timezone=timezone.utc, job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30}
        )
        now = datetime.now(timezone.utc)
        sched.add_job(self.tick, "interval", seconds=self.config.daemon.tick_seconds, id="tick", next_run_time=now)
        if self.config.preemption.sources:
            sched.add_job(
                self.watch, "interval", seconds=self.config.preemption.poll_seconds, id="watch", next_run_time=now
            )
        if self.config.notifiers:
            sched.add_job(self.deliver, "interval", seconds=1.0, id="outbox", next_run_time=now)
        if self.config.daemon.warm_preflight:
            sched.add_job(self.keep_preflight_warm, "interval", seconds=5.0, id="preflight")
        self.scheduler = sched
        sched.start()
        if self.mirror is not None:
            self.mirror.start()
        from .mtbf import update_mtbf  # [checkpoint] every = "auto" reads it from the job's environment

        sched.add_job(update_mtbf, "interval", args=[self], seconds=60, id="mtbf", next_run_time=now)
        from .pending_adopt import schedule_pending_adoptions  # a planned move's hand-over, adopted when it comes

        schedule_pending_adoptions(self, sched, now)
        log.info(
            "daemon started: home %s, GPUs %s, CPU slots %s",
            self.home.root,
            self.daemon.gpus_said(),
            self.config.daemon.cpu_slots,
        )
        while not self.stop_event.wait(0.5):
            pass
        # The jobs are told at once: the scheduler's shutdown waits for a tick that may be deep in
        # a job start's probes (prestart.py), and a machine going down does not wait for it.
        self.signal_stop()
        sched.shutdown(wait=True)
        self.shutdown()
        with self._preflight_lock:  # a submit's word that came during the stop starts nothing now
            preflight_server.stop(self.warm_preflight, self.home)
        sock.close()
        return 0

    def keep_preflight_warm(self) -> None:
        """A warm pre-flight that exited because a module it loaded changed (exit 0: a package
        upgraded, the code edited) is started again, on the files as they are now; one that could
        not start or crashed (any other exit) is not, so it cannot loop: submits use the subprocess."""
        with self._preflight_lock:
            proc = self.warm_preflight
            if proc is not None and proc.poll() == 0:
                self.warm_preflight = preflight_server.start(self.home)

    def want_warm_preflight(self) -> None:
        """A built-in job was submitted and found no warm pre-flight: start one (once per daemon;
        one that could not start or crashed is not started again)."""
        if not self.config.daemon.warm_preflight or self.stop_event.is_set():
            return
        with self._preflight_lock:
            if self.warm_preflight is None:
                self.warm_preflight = preflight_server.start(self.home)

    def _listen_loop(self, sock: Any) -> None:
        while not self.stop_event.is_set():
            try:
                what, sender = sock.recvfrom(64)
            except TimeoutError:
                continue
            except OSError:
                return
            if what == COUNTERS:  # a question, not a nudge: answered, nothing done
                answer_counters(
                    sock, sender, self.daemon.counters(), notices=self.watcher, outbox=self.sender, mirror=self.mirror
                )
                continue
            if what == WARM_PREFLIGHT:
                self.want_warm_preflight()
            self.poke()

    def signal_stop(self) -> list[int]:
        """Nothing new starts; every running job gets SIGTERM once; the mirror goes urgent. Their ids."""
        self.daemon.stopping = True
        if self.mirror is not None:
            self.mirror.on_notice()
        self.daemon.preempt_all(time.time(), "the daemon is stopping", notice=False)
        return [j.id for j in self.daemon.store.jobs([JobState.RUNNING])]

    def shutdown(self) -> None:
        """SIGTERM every job, wait up to the grace for their checkpoints, record them queued for
        resume. A job still running after that is adopted or requeued by the next daemon."""
        d = self.daemon
        began = time.monotonic()
        signalled = self.signal_stop()
        # A job's own grace_seconds may be longer than the config's: wait for the longest.
        grace = max(
            [grace_for(j, self.config) for j in d.store.jobs([JobState.RUNNING]) if not j.in_foreground],
            default=self.config.daemon.grace_seconds,
        )
        if signalled:
            log.info("stopping: waiting up to %.0fs for %d job(s) to checkpoint", grace, len(signalled))
        deadline = time.monotonic() + grace + 5
        while time.monotonic() < deadline:
            d.tick(time.time())
            if d.running_count(own_only=True) == 0:  # `orch run`'s jobs go on (preempt_all)
                break
            time.sleep(0.1)
        d.tick(time.time())
        if self.mirror is not None:  # the notice checkpoints mirrored (up to the deadline), leases released
            self.mirror.drain(began + self.config.storage.notice_deadline_seconds)
            self.mirror.stop()
            self.mirror.release_all()
        self.deliver()
        self.hooks.wait_idle(10)
        self.hooks.close(5)
        self.watcher.close()
        log.info("daemon stopped")


class IdleShutdown:
    """[idle] shutdown_after_minutes: once nothing is queued or running (held jobs count as
    queued) for that long, notify, wait (bounded) for the message to go out, then run the
    shutdown command once. Any work resets the countdown; a later idle period arms it again."""

    def __init__(self, rt: DaemonRuntime):
        self.rt = rt
        self.idle_since: Optional[float] = None
        self.fired = False
        self.event_at: Optional[float] = None
        self.event_id: Optional[int] = None

    def check(self, now: float) -> None:
        cfg = self.rt.config.idle
        if cfg.shutdown_after_minutes is None:
            return
        counts = self.rt.store.count_by_state()
        # Jobs held only because the total budget is spent will not start: the machine is idle.
        held_by_budget = not counts.get(JobState.RUNNING, 0) and self.rt.daemon.total_budget_reason() is not None
        if counts.get(JobState.QUEUED, 0) + counts.get(JobState.RUNNING, 0) and not held_by_budget:
            self.idle_since, self.fired, self.event_at, self.event_id = None, False, None, None
            return
        if self.fired:
            return
        if self.idle_since is None:
            self.idle_since = now
            return
        if self.event_at is None and now - self.idle_since >= cfg.shutdown_after_minutes * 60:
            said = f"idle for {cfg.shutdown_after_minutes:g} min; running {cfg.shutdown_command}"
            self.event_id = self.rt.store.record_event(
                None,
                EventKind.IDLE_SHUTDOWN,
                now,
                detail=said,
                outgoing=machine_outgoing(self.rt.config, EventKind.IDLE_SHUTDOWN, said),
            )
            self.event_at = now
            self.rt.deliver()
        if self.event_at is not None:
            # Only this message matters: a channel failing on older rows must not hold the
            # machine up (notify_wait_seconds bounds the wait either way).
            delivered = not any(
                r.event_id == self.event_id and r.delivered_at is None and r.gave_up_at is None
                for r in self.rt.store.outbox()
            )
            if delivered or now - self.event_at >= cfg.notify_wait_seconds:
                from .hooks import run_shutdown_command

                self.fired = True
                log.warning(
                    "idle for %.0f min: running the shutdown command %s",
                    cfg.shutdown_after_minutes,
                    cfg.shutdown_command,
                )
                self.rt.hooks.submit_event("idle_shutdown", None)
                run_shutdown_command(list(cfg.shutdown_command), logging.getLogger("orch.idle"))


def run_daemon(home: Home, config: Config, *, detached: bool = False) -> int:
    lock = DaemonLock(home)
    lock.acquire()
    try:
        setup_logging(home, config, detached)
        store = Store(home.db)
        rt = DaemonRuntime(home, config, store)

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("received %s: stopping", signal.Signals(signum).name)
            rt.stop_event.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN if detached else on_signal)
        return rt.run()
    finally:
        lock.release()
