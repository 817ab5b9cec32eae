"""`orch`: the command line. Thin: parse, call one function, render. Errors become exit codes
only here (2 bad input, 1 the request failed); hints go to stderr so --json stays parseable."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

import typer
from typer.core import TyperGroup

from ..errors import OrchError
from ..paths import Home


class OrchGroup(TyperGroup):
    """Turns our errors into a message on stderr and an exit code (2 bad input, 1 failed
    request), for the real `orch` and for CliRunner alike: never a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except OrchError as exc:
            text = str(exc)
            print(text if exc.exit_code == 2 else f"orch: {text}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        except Exception as exc:
            if not _disk_full(exc):
                raise
            # SQLite rolls the transaction back: the store is as it was, only this request failed.
            root = _state_root()
            print(f"orch: the disk holding {root} is full ({exc}); nothing was recorded. Free space "
                  f"(`df -h {root}`, `orch doctor`) and try again", file=sys.stderr)
            raise typer.Exit(1) from None


def _state_root() -> Path:
    return Home.locate(ctx.home_arg).root  # the module's Ctx (OrchGroup.invoke's `ctx` is click's)


def _disk_full(exc: Optional[BaseException]) -> bool:
    """ENOSPC, or SQLite's "database or disk is full" — also when a failed ROLLBACK on the full
    disk replaced it with "disk I/O error" (the original is then the exception's context)."""
    import errno
    import sqlite3

    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
            return True
        if isinstance(exc, sqlite3.OperationalError) and "disk I/O error" in str(exc):
            import shutil

            try:  # opening the WAL on a full disk fails this way: tell it by the free space
                return shutil.disk_usage(_state_root()).free < (1 << 20)
            except OSError:
                return False
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


app = typer.Typer(cls=OrchGroup, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="orch: queue training jobs on rented GPUs; resume after preemption; count the cost; "
                       "get notified; power off when done.")
daemon_app = typer.Typer(no_args_is_help=True, help="Run, start, stop or inspect the background daemon.")
notify_app = typer.Typer(no_args_is_help=True, help="Check the notification channels.")
config_app = typer.Typer(no_args_is_help=True, help="Check config.toml.")
app.add_typer(daemon_app, name="daemon")
app.add_typer(notify_app, name="notify")
app.add_typer(config_app, name="config")
storage_app = typer.Typer(no_args_is_help=True, help="Check the [storage] mirror.")
app.add_typer(storage_app, name="storage")


class Ctx:
    home_arg: Optional[str] = None
    config_arg: Optional[str] = None

    @property
    def home(self) -> Home:
        return Home.locate(self.home_arg)

    def store(self):
        from ..store import Store

        home = self.home.ensure()
        return Store(home.db)

    @property
    def config_path(self) -> Path:
        return self.home.config_path(self.config_arg)

    def config(self, *, build_notifiers: bool = False):
        from ..config import load_config

        return load_config(self.config_path, required=self.config_arg is not None, build_notifiers=build_notifiers)


ctx = Ctx()


def err(text: str) -> None:
    print(text, file=sys.stderr)


def emit_json(data: Any) -> None:
    # Indented for a person at a terminal; compact for a pipe (the indenting encoder is ~4x slower).
    print(json.dumps(data, indent=2 if sys.stdout.isatty() else None, default=str))


@app.callback()
def main_options(
    home: Optional[str] = typer.Option(None, "--home", help="State folder (default $ORCH_HOME or ~/.orch)."),
    config: Optional[str] = typer.Option(None, "--config", help="config.toml (default $ORCH_CONFIG or $ORCH_HOME/config.toml)."),
) -> None:
    ctx.home_arg, ctx.config_arg = home, config


def _daemon_pid(home: Home) -> Optional[int]:
    from ..daemon_control import running_pid

    return running_pid(home)


def _poke(home: Home) -> bool:
    from ..wake import poke

    return poke(home.wake_socket)


# -- submit / run -----------------------------------------------------------------------


@app.command()
def submit(
    job_toml: Path = typer.Argument(..., help="The job file (see examples/)."),
    priority: Optional[int] = typer.Option(None, "--priority", help="Higher runs first (overrides the file)."),
    after: List[int] = typer.Option([], "--after", help="Start only after job ID succeeded (repeatable)."),
    at: Optional[str] = typer.Option(None, "--at", help="Hold until a time: 2026-12-01T02:00 (local), or +30m, +2h."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"id\", \"name\", \"state\"} as JSON."),
) -> None:
    """Validate a job file and queue it."""
    from ..gpus import managed_gpus
    from ..lifecycle import submit_job
    from .when import parse_at

    now = time.time()
    not_before = parse_at(at, now) if at else None
    config = ctx.config()
    store = ctx.store()
    job = submit_job(store, config, ctx.home, job_toml, now=now, priority=priority, after=after,
                     not_before=not_before, machine_gpus=config.slurm.max_gpus if config.executor.kind == "slurm"
                     else len(managed_gpus(config.daemon.gpus)))
    running = _poke(ctx.home)
    if as_json:
        emit_json({"id": job.id, "name": job.name, "state": job.state.value})
    else:
        print(f"submitted job {job.id} ({job.name})")
    if not running:
        err("note: no daemon is running; start one with `orch daemon start` (or run it now with `orch run`)")


@app.command()
def run(
    job_toml: Optional[Path] = typer.Argument(None, help="The job file."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue job ID from its latest checkpoint."),
) -> None:
    """Record a job like submit, then run it here in the foreground (no daemon)."""
    from .foreground import run_foreground

    if (job_toml is None) == (resume is None):
        raise typer.BadParameter("give a job file or --resume ID (one of them)")
    code = run_foreground(ctx.home.ensure(), ctx.store(), ctx.config(), job_toml=job_toml, resume_id=resume)
    raise typer.Exit(code)


# -- looking at jobs --------------------------------------------------------------------


@app.command()
def status(
    show_all: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    as_json: bool = typer.Option(False, "--json", help="A JSON list, one object per job."),
) -> None:
    """The queue: id, name, state, attempt, progress, ETA, runtime, cost."""
    from .views import status_rows

    from ..storage.status import add_lag_notes

    home = ctx.home
    store = ctx.store()
    rows = status_rows(store, home, time.time(), include_all=show_all)
    add_lag_notes(store, rows)  # [storage]: a note when the mirror lags
    if as_json:
        emit_json(rows)
        return
    if not rows:
        print("no jobs" + ("" if show_all else " queued or running (`orch status --all` shows finished ones)"))
        _say_draining(home)
        return
    import os
    import shutil

    from .render import status_table

    tty = sys.stdout.isatty()
    print(status_table(rows, _currency(), color=tty and not os.environ.get("NO_COLOR"),
                       width=shutil.get_terminal_size().columns if tty else None))
    if _daemon_pid(home) is None and any(r["state"] in ("queued", "running") for r in rows):
        err("note: no daemon is running; `orch daemon start` runs the queue")
    _say_draining(home)


def _say_draining(home: Home) -> None:
    from ..drain import requested

    if requested(home) is not None and _daemon_pid(home) is not None:
        err("note: the daemon is draining: running jobs finish, nothing new starts, then it exits")


def _currency() -> str:
    if ctx.config_arg is None and not ctx.config_path.exists():
        return ""  # no config: skip building the config models (part of `orch status`'s budget)
    try:
        return ctx.config().pricing.currency
    except OrchError:
        return ""


@app.command()
def show(job_id: int = typer.Argument(...), as_json: bool = typer.Option(False, "--json")) -> None:
    """A job's spec, state, provenance, attempts, checkpoints, cost and event history."""
    from .render import show_text
    from .views import show_data

    store = ctx.store()
    data = show_data(store, ctx.home, job_id)
    data["mirror"] = _mirror_view(store, job_id)
    from ..contract import CHECKPOINT_INTERVAL, read_json

    data["checkpoint_interval"] = read_json(ctx.home.run_dir(job_id) / CHECKPOINT_INTERVAL)  # every = "auto"
    if as_json:
        emit_json(data)
    else:
        print(show_text(data, _currency()))


@app.command()
def logs(
    job_id: int = typer.Argument(...),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing, across attempts, until the job ends."),
    lines: Optional[int] = typer.Option(None, "-n", help="Only the last N lines."),
) -> None:
    """The job's log (all attempts, oldest first)."""
    from .logview import print_logs

    raise typer.Exit(print_logs(ctx.store(), ctx.home, job_id, follow=follow, last=lines))


# -- changing jobs ----------------------------------------------------------------------


@app.command()
def cancel(job_id: int = typer.Argument(...)) -> None:
    """Cancel a job: a queued one at once; a running one gets SIGTERM, a grace period, then SIGKILL."""
    from ..lifecycle import cancel_job

    config = ctx.config()
    job, done = cancel_job(ctx.store(), config, ctx.home, job_id, time.time())
    if done:
        print(f"cancelled job {job.id} ({job.name})")
        return
    alive = _poke(ctx.home)
    print(f"cancelling job {job.id} ({job.name}): SIGTERM now, SIGKILL after {config.daemon.grace_seconds:g}s")
    if not alive:
        err("note: no daemon is running; the cancel happens when one starts (`orch daemon start`)")


@app.command()
def retry(
    job_id: int = typer.Argument(...),
    budget: Optional[float] = typer.Option(None, "--budget", help="A new max_cost for the job.", min=0.0),
    hours: Optional[float] = typer.Option(None, "--hours", help="A new max_hours for the job.", min=0.0),
) -> None:
    """Put a failed, cancelled or stopped job back in the queue; it resumes from its latest checkpoint."""
    from ..lifecycle import retry_job

    job = retry_job(ctx.store(), ctx.config(), ctx.home, job_id, time.time(), budget=budget, hours=hours)
    print(f"job {job.id} ({job.name}) queued again; it resumes from its latest checkpoint")
    if not _poke(ctx.home):
        err("note: no daemon is running; start one with `orch daemon start`")


@app.command()
def cost(as_json: bool = typer.Option(False, "--json")) -> None:
    """Per-job and total cost, GPU-hours, idle cost and preemption waste."""
    from .cost_report import cost_data, cost_table

    data = cost_data(ctx.store(), ctx.config())
    if as_json:
        emit_json(data)
    else:
        print(cost_table(data))


@app.command()
def dashboard(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; anything but loopback needs the token printed at start."),
    port: int = typer.Option(8787, "--port", min=0, max=65535, help="Port (0: any free one)."),
) -> None:
    """A read-only local web page: the queue, each job's curves and events, the bill."""
    from .dashboard.server import serve

    serve(ctx.home, ctx.config(), host=host, port=port)


# -- daemon -----------------------------------------------------------------------------


@daemon_app.command("run")
def daemon_run(detached: bool = typer.Option(False, "--detached", hidden=True)) -> None:
    """Run the daemon in the foreground (for systemd, supervisord or tmux)."""
    from ..daemon.runtime import run_daemon

    raise typer.Exit(run_daemon(ctx.home.ensure(), ctx.config(build_notifiers=True), detached=detached))


@daemon_app.command("start")
def daemon_start() -> None:
    """Start the daemon in the background; it survives the terminal closing."""
    from ..daemon_control import start_detached

    ctx.config(build_notifiers=True)  # refuse a bad config here, not silently in the log
    pid = start_detached(ctx.home.ensure(), ctx.config_arg)
    print(f"daemon started (pid {pid}); log: {ctx.home.log_file}")


@daemon_app.command("stop")
def daemon_stop(timeout: float = typer.Option(120.0, help="Seconds to wait for running jobs to checkpoint.")) -> None:
    """Stop the daemon: running jobs checkpoint and are queued again for later."""
    from ..daemon_control import stop

    pid = stop(ctx.home, timeout=timeout)
    print(f"daemon (pid {pid}) stopped")


@daemon_app.command("drain")
def daemon_drain(wait: bool = typer.Option(False, "--wait", help="Block until the daemon has exited."),
                 timeout: float = typer.Option(0.0, help="With --wait: give up after this many seconds (0: never).")) -> None:
    """Finish the running jobs, start nothing new, then exit (maintenance, moving to another machine)."""
    from ..daemon_control import running_pid
    from ..drain import request
    from ..errors import DaemonError

    home = ctx.home
    pid = running_pid(home)
    if pid is None:
        raise DaemonError(f"no daemon is running for {home.root}; nothing to drain")
    request(home)
    _poke(home)
    print(f"daemon (pid {pid}) draining: running jobs finish, nothing new starts, then it exits"
          " (`orch daemon start` runs the queue again)")
    if wait:
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while running_pid(home) is not None:
            if deadline is not None and time.monotonic() > deadline:
                raise DaemonError(f"the daemon (pid {pid}) is still draining after {timeout:g}s")
            time.sleep(0.2)
        print(f"daemon (pid {pid}) drained and exited")


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="A JSON list of findings.")) -> None:
    """Check the daemon, store, running jobs, processes, disk, config, notifiers and clock; say how to fix."""
    from .doctor import BAD, render, run_checks

    findings = run_checks(ctx.home, ctx.config_path, ctx.config_arg is not None)
    if as_json:
        emit_json([f.as_dict() for f in findings])
    else:
        print(render(findings))
    raise typer.Exit(1 if any(f.level == BAD for f in findings) else 0)


@daemon_app.command("status")
def daemon_status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Whether the daemon runs: pid and uptime."""
    from ..daemon_control import describe

    info = describe(ctx.home)
    if as_json:
        emit_json(info)
    elif info["running"]:
        from .render import duration

        from ..drain import requested

        draining = " (draining: running jobs finish, nothing new starts)" if requested(ctx.home) is not None else ""
        print(f"daemon running: pid {info['pid']}, up {duration(info['uptime_s'])}, home {info['home']}{draining}")
    else:
        print(f"no daemon running for {info['home']}")
        raise typer.Exit(1)


# -- notify / config --------------------------------------------------------------------


@notify_app.command("test")
def notify_test(channel: Optional[str] = typer.Option(None, "--channel", help="Only this channel (its name).")) -> None:
    """Send a test message through the configured channels; print each one's outcome."""
    from .notify_check import send_test

    raise typer.Exit(send_test(ctx.config(build_notifiers=True), channel))


@config_app.command("check")
def config_check(path: Optional[Path] = typer.Argument(None, help="config.toml (default: the one orch uses).")) -> None:
    """Validate config.toml, including every notifier's keys and secrets."""
    from ..config import load_config

    target = path or ctx.config_path
    if not target.exists():
        if path is not None or ctx.config_arg is not None:
            from ..errors import ConfigError

            raise ConfigError([f"{target}: no such file"])
        print(f"no config at {target}; the defaults apply (CPU slots 1, GPUs discovered, no pricing, no notifiers)")
        return
    config = load_config(target, required=True, build_notifiers=True)
    names = [n for n, _ in config.routes()]
    print(f"{target}: ok" + (f" (notifiers: {', '.join(names)})" if names else ""))


def _mirror_view(store: Any, job_id: int) -> Optional[dict]:
    if ctx.config_arg is None and not ctx.config_path.exists():
        return None
    try:
        config = ctx.config()
    except OrchError:
        return None
    from ..storage.status import mirror_view

    return mirror_view(store, config, store.get(job_id))


# -- storage / adopt --------------------------------------------------------------------


@app.command()
def adopt(
    url: str = typer.Argument(..., help="The mirror: s3://bucket/prefix, gs://, az://, file:///folder."),
    job: List[str] = typer.Option([], "--job", help="A job's global id (or a prefix of it, or its name); repeatable."),
    all_jobs: bool = typer.Option(False, "--all", help="Every unfinished job (queued, running, stopped) in the mirror."),
    force: bool = typer.Option(False, "--force", help="Adopt even if its owner's heartbeat is fresh."),
    maps: List[str] = typer.Option([], "--map", help="OLD=NEW: look for input files under OLD at NEW (repeatable)."),
) -> None:
    """Take unfinished jobs over from another machine's mirror and queue them to resume here."""
    from .adopt import run_adopt

    raise typer.Exit(run_adopt(ctx.home.ensure(), ctx.config(), ctx.store(), url, jobs=job, take_all=all_jobs,
                               force=force, maps=maps))


@storage_app.command("check")
def storage_check(
    url: Optional[str] = typer.Argument(None, help="Another URL than [storage] url."),
    mb: float = typer.Option(64.0, "--mb", help="Size of the timed probe upload, MB.", min=1.0),
) -> None:
    """Write, read, conditionally write and delete a probe object; time an upload."""
    from .storage_check import check_storage

    raise typer.Exit(check_storage(ctx.home.ensure(), ctx.config(), url, mb, print))


def main() -> None:
    app(prog_name="orch")


if __name__ == "__main__":
    main()
