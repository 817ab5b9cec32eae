"""The `orch watch` loop: one controller per home (home/watch_lock.py), a pass per poll, the
controller's own notification outbox delivered as the daemon delivers its own, and one line for
each change people should see. The CLI (cli/watch.py) gives it where to print."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..home.watch_lock import WatchLock, record_pass
from ..model.errors import ConfigError
from ..views.recovery import waiting_line


@dataclass(frozen=True)
class Output:
    """Where the loop's lines go: `say` for the log of a running watch (the CLI stamps the time and
    masks secrets), `show` for --once's plain table, `start` for the controller's gate line."""

    say: Callable[[str], None]
    show: Callable[[str], None]
    start: Callable[[str], None]


def run_watch(home: Any, config: Any, store: Any, url: Optional[str], *, once: bool, out: Output) -> int:
    """The provider commands still running are killed with their process groups however the loop
    ends (SIGTERM, SIGINT, an error, --once)."""
    from ..recovery import groups

    lock = WatchLock(home)
    lock.acquire()
    try:
        return _watch(home, config, store, url, once=once, out=out)
    finally:
        killed = groups.kill_all()
        if killed:
            out.say(
                f"killed {len(killed)} provider command(s) still running "
                f"(process group(s) {', '.join(map(str, killed))}): counted as not done"
            )
        lock.release()


def _watch(home: Any, config: Any, store: Any, url: Optional[str], *, once: bool, out: Output) -> int:
    from ..adopt.plan import storage_for
    from ..jobs.outbox import OutboxSender
    from ..objectstore import manifest as mf
    from ..objectstore.remote import Remote, StorageError
    from ..objectstore.signing import keys_from
    from ..recovery.build import build_provider
    from ..recovery.controller import Controller
    from ..recovery.launcher import Launcher

    if config.recovery is None:
        where = config.path or home.config_path(None)
        raise ConfigError(
            [f"{where}: recovery: no [recovery] table; `orch watch` needs one (provider, launch: docs/recovery.md)"]
        )
    section = storage_for(config, url, how="orch watch s3://bucket/prefix", must_exist=True)
    remote = Remote(section)
    provider = build_provider(config.recovery)
    sender = OutboxSender.from_config(store, config)
    # Provider calls off the loop (a hanging launch never stalls the others); at once with --once.
    launcher = None if once else Launcher(config.recovery.launch_timeout_minutes * 60)
    controller = Controller(
        config,
        store,
        remote,
        provider,
        controller_id=mf.home_identity(home),
        say=out.say,
        launcher=launcher,
        keys=keys_from(section, os.environ),
    )
    out.start(f"orch watch: {controller.gate.start_line()}")
    stop = threading.Event()
    if not once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        out.say(
            f"watching {remote.url.raw} every {config.recovery.poll_seconds:g} s "
            f"(provider {provider.name}; a lease silent {config.storage.stale_after_minutes:g} min is lost)"
        )
    shown: dict[str, str] = {}
    passes = 0
    while True:
        try:
            views = controller.pass_once()
        except StorageError as exc:
            out.say(f"cannot read the mirror ({exc}); trying again at the next poll")
            if once:
                return 1
            views = []
        sender.deliver_due(time.time())
        _say_changes(controller, store, remote.url.raw, shown, once, out)
        passes += 1
        record_pass(home, passes, time.time())  # a whole pass: its outcomes, outbox and lines done
        if once:
            if not views:
                out.show(f"no jobs in {remote.url.raw}")
            return 0
        if stop.wait(_next_look(controller, config.recovery.poll_seconds)):
            out.say("stopped")
            if launcher is not None:
                launcher.close()
            return 0


def _say_changes(controller: Any, store: Any, url: str, shown: dict[str, str], once: bool, out: Output) -> None:
    """The launcher pool's note when it changes, and each job waiting for a machine: every row with
    --once, else a row when its state, note or launch count changes."""
    pool = controller.pool_note()
    if pool and pool != shown.get("", ""):
        out.say(pool)
    shown[""] = pool
    now = time.time()
    for row in store.recovery_rows():
        if row["url"] != url:
            continue  # a job this home watched in another mirror: not this one's
        line = waiting_line(row, now)
        key = f"{row['state']}|{row['note']}|{row['launches']}"
        if once:
            out.show(line)
        elif shown.get(row["uid"]) != key:
            shown[row["uid"]] = key
            out.say(line)


def _next_look(controller: Any, poll_s: float) -> float:
    """The next pass: at the poll, or sooner while a provider call runs (its outcome is recorded
    within a second or so of its return)."""
    return min(poll_s, 1.0) if controller.in_flight() else poll_s
