"""`orch watch [URL] [--once]`: the recovery controller in the foreground (orchestrator/recovery/).
Here: the config checks, the loop, its output, and the controller's own outbox."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Optional

from ..model.errors import ConfigError
from ..redaction import redact
from ..views.recovery import waiting_line, waiting_rows


def run_watch(home: Any, config: Any, store: Any, url: Optional[str], *, once: bool) -> int:
    """One controller per home (home/watch_lock.py); the provider commands still running are
    killed with their process groups however the loop ends (SIGTERM, SIGINT, an error, --once)."""
    from ..home.watch_lock import WatchLock
    from ..recovery import groups

    lock = WatchLock(home)
    lock.acquire()
    try:
        return _watch(home, config, store, url, once=once)
    finally:
        killed = groups.kill_all()
        if killed:
            print(
                f"{time.strftime('%H:%M:%S')} killed {len(killed)} provider command(s) still running "
                f"(process group(s) {', '.join(map(str, killed))}): counted as not done",
                flush=True,
            )
        lock.release()


def _watch(home: Any, config: Any, store: Any, url: Optional[str], *, once: bool) -> int:
    from ..adopt.plan import storage_for
    from ..jobs.notify import build_channels
    from ..daemon.outbox import OutboxSender
    from ..objectstore import manifest as mf
    from ..objectstore.remote import Remote, StorageError
    from ..objectstore.signing import keys_from
    from ..recovery.controller import Controller
    from ..recovery.launcher import Launcher
    from ..recovery.build import build_provider

    if config.recovery is None:
        where = config.path or home.config_path(None)
        raise ConfigError(
            [f"{where}: recovery: no [recovery] table; `orch watch` needs one (provider, launch: docs/recovery.md)"]
        )
    section = storage_for(config, url, how="orch watch s3://bucket/prefix", must_exist=True)
    keys = keys_from(section, os.environ)
    remote = Remote(section)
    provider = build_provider(config.recovery)
    sender = OutboxSender(
        store,
        {n.name: n for n in build_channels(config)},
        max_age_s=config.notify.give_up_after_hours * 3600,
        base_backoff_s=config.notify.retry_base_seconds,
        max_backoff_s=config.notify.retry_max_seconds,
    )

    def say(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {redact(text)}", flush=True)

    # Provider calls off the loop (a hanging launch never stalls the others); at once with --once.
    launcher = None if once else Launcher(config.recovery.launch_timeout_minutes * 60)
    controller = Controller(
        config, store, remote, provider, controller_id=mf.home_identity(home), say=say, launcher=launcher, keys=keys
    )
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    print(f"orch watch: {controller.gate.start_line()}", file=sys.stderr if once else sys.stdout, flush=True)
    stop = threading.Event()
    if not once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        say(
            f"watching {remote.url.raw} every {config.recovery.poll_seconds:g} s "
            f"(provider {provider.name}; a lease silent {config.storage.stale_after_minutes:g} min is lost)"
        )
    from ..home.watch_lock import record_pass

    shown: dict[str, str] = {}
    failures = passes = 0
    while True:
        try:
            views = controller.pass_once()
            failures = 0
        except StorageError as exc:
            failures += 1
            say(f"cannot read the mirror ({exc}); trying again at the next poll")
            if once:
                return 1
            views = []
        passes += 1
        record_pass(home, passes, time.time())
        sender.deliver_due(time.time())
        pool = controller.pool_note()
        if pool and pool != shown.get("", ""):
            say(pool)
        shown[""] = pool
        now = time.time()
        for row in store.recovery_rows():
            if row["url"] != remote.url.raw:
                continue  # a job this home watched in another mirror: not this one's
            line = waiting_line(row, now)
            key = f"{row['state']}|{row['note']}|{row['launches']}"
            if once:
                print(line)
            elif shown.get(row["uid"]) != key:
                shown[row["uid"]] = key
                say(line)
        if once:
            if not views:
                print(f"no jobs in {remote.url.raw}")
            return 0
        if stop.wait(_next_look(controller, config.recovery.poll_seconds)):
            say("stopped")
            if launcher is not None:
                launcher.close()
            return 0


def _next_look(controller: Any, poll_s: float) -> float:
    """The next pass: at the poll, or sooner while a provider call runs (its outcome is recorded
    within a second or so of its return)."""
    return min(poll_s, 1.0) if controller.in_flight() else poll_s


def status_note(store: Any, out: Optional[Any] = None) -> None:
    """`orch status` in a home where `orch watch` runs: the jobs waiting for a machine (views/recovery.py)."""
    now = time.time()
    for row in waiting_rows(store):
        print("recovery: " + waiting_line(row, now), file=out or sys.stderr)
