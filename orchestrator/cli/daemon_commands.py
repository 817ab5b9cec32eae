"""`orch daemon run | start | stop | install | drain | status` and `orch doctor`."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from .context import app, ctx, daemon_app, emit_json, err, poke


# -- daemon -----------------------------------------------------------------------------


@daemon_app.command("run")
def daemon_run(detached: bool = typer.Option(False, "--detached", hidden=True)) -> None:
    """Run the daemon in the foreground (for systemd, supervisord or tmux)."""
    from ..daemon.runtime import run_daemon

    raise typer.Exit(run_daemon(ctx.home.ensure(), ctx.config(build_notifiers=True), detached=detached))


@daemon_app.command("start")
def daemon_start() -> None:
    """Start the daemon in the background; it survives the terminal closing."""
    from ..home.daemon_lock import start_detached

    ctx.config(build_notifiers=True)  # refuse a bad config here, not silently in the log
    pid = start_detached(ctx.home.ensure(), ctx.config_arg)
    print(f"daemon started (pid {pid}); log: {ctx.home.log_file}")


@daemon_app.command("stop")
def daemon_stop(timeout: float = typer.Option(120.0, help="Seconds to wait for running jobs to checkpoint.")) -> None:
    """Stop the daemon: running jobs checkpoint and are queued again for later."""
    from ..home.daemon_lock import stop

    pid = stop(ctx.home, timeout=timeout)
    print(f"daemon (pid {pid}) stopped")


@daemon_app.command("install")
def daemon_install(
    show: bool = typer.Option(False, "--print", help="Show the systemd unit or crontab line; change nothing."),
    root: Path = typer.Option(Path("/"), "--root", hidden=True),  # tests: detect on a folder of real files
) -> None:
    """Start the daemon at every boot (a systemd unit, else a crontab @reboot line), so queued jobs
    resume after a restart without a login."""
    from .daemon_install import SYSTEMD, install, plan, run_command

    ctx.config(build_notifiers=True)  # refuse a bad config now, not at the next boot
    home = ctx.home.ensure()
    config_path = ctx.config_path
    boot = plan(home, None if config_path == home.root / "config.toml" else config_path, root=root)
    if boot.note:
        err(f"note: {boot.note}")
    if show:
        where = f"# {boot.target} (then: systemctl enable {boot.name})" if boot.kind == SYSTEMD else f"# {boot.target}"
        print(f"{where}\n{boot.text}", end="" if boot.text.endswith("\n") else "\n")
        return
    for line in install(boot, home, run_command):
        print(line)


@daemon_app.command("drain")
def daemon_drain(
    wait: bool = typer.Option(False, "--wait", help="Block until the daemon has exited."),
    timeout: float = typer.Option(0.0, help="With --wait: give up after this many seconds (0: never)."),
) -> None:
    """Finish the running jobs, start nothing new, then exit (maintenance, moving to another machine)."""
    from ..home.daemon_lock import running_pid
    from ..home.drain import request
    from ..host.polling import poll
    from ..model.errors import DaemonError

    home = ctx.home
    pid = running_pid(home)
    if pid is None:
        raise DaemonError(f"no daemon is running for {home.root}; nothing to drain")
    request(home)
    poke(home)
    print(
        f"daemon (pid {pid}) draining: running jobs finish, nothing new starts, then it exits"
        " (`orch daemon start` runs the queue again)"
    )
    if wait:
        if not poll(lambda: running_pid(home) is None, timeout if timeout > 0 else math.inf, 0.2):
            raise DaemonError(f"the daemon (pid {pid}) is still draining after {timeout:g}s")
        print(f"daemon (pid {pid}) drained and exited")


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="A JSON list of findings.")) -> None:
    """Check the daemon, store, running jobs, processes, disk, config, notifiers and clock; say how to fix."""
    from .doctor import run_checks
    from .doctor_findings import BAD, render

    findings = run_checks(ctx.home, ctx.config_path, ctx.config_arg is not None)
    if as_json:
        emit_json([f.as_dict() for f in findings])
    else:
        print(render(findings))
    raise typer.Exit(1 if any(f.level == BAD for f in findings) else 0)


@daemon_app.command("status")
def daemon_status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Whether the daemon runs: pid and uptime."""
    from ..home.daemon_lock import describe

    info = describe(ctx.home)
    if as_json:
        emit_json(info)
    elif info["running"]:
        from ..views.render import duration

        from ..home.drain import requested

        draining = " (draining: running jobs finish, nothing new starts)" if requested(ctx.home) is not None else ""
        print(f"daemon running: pid {info['pid']}, up {duration(info['uptime_s'])}, home {info['home']}{draining}")
    else:
        print(f"no daemon running for {info['home']}")
        raise typer.Exit(1)
