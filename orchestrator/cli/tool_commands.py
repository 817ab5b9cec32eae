"""`orch notify test`, `config check`, `dashboard`, `adopt`, `storage check`: the verbs around the queue."""

from __future__ import annotations

import os

from pathlib import Path
from typing import List, Optional

import typer

from ..model.executor_kinds import executor_kind
from .context import app, config_app, ctx, err, notify_app, storage_app


# -- notify / config --------------------------------------------------------------------


@notify_app.command("test")
def notify_test(channel: Optional[str] = typer.Option(None, "--channel", help="Only this channel (its name).")) -> None:
    """Send a test message through the configured channels; print each one's outcome."""
    from .notify_check import send_test

    raise typer.Exit(send_test(ctx.config(build_notifiers=True), channel))


@config_app.command("check")
def config_check(path: Optional[Path] = typer.Argument(None, help="config.toml (default: the one orch uses).")) -> None:
    """Validate config.toml, including every notifier's keys and secrets."""
    from ..jobs.notify import load_config_checked

    target = path or ctx.config_path
    if not target.exists():
        if path is not None or ctx.config_arg is not None:
            from ..model.errors import ConfigError

            raise ConfigError([f"{target}: no such file"])
        print(f"no config at {target}; the defaults apply (CPU slots 1, GPUs discovered, no pricing, no notifiers)")
        return
    os.environ.update(ctx.home.daemon_environ())  # the daemon's environment (see Ctx.config)
    config = load_config_checked(target, required=True)
    names = [n for n, _ in config.routes()]
    print(f"{target}: ok" + (f" (notifiers: {', '.join(names)})" if names else ""))
    from notifiers import secrets_in_the_file

    for warning in secrets_in_the_file(config.notifiers, label=str(target)):
        err(f"warning: {warning}")
    if executor_kind(config.executor.kind).on_this_machine:  # a cluster's GPUs are not this login node's
        from ..host.gpus import absent_gpus_problem, discover

        gpus = absent_gpus_problem(config.daemon.gpus, discover())
        if gpus:
            err(f"warning: {target}: {gpus}")


@app.command()
def dashboard(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on; anything but loopback needs the token printed at start."
    ),
    port: int = typer.Option(8787, "--port", min=0, max=65535, help="Port (0: any free one)."),
) -> None:
    """A read-only local web page: the queue, each job's curves and events, the bill."""
    from ..dashboard.server import serve

    serve(ctx.home.ensure(), ctx.config(), host=host, port=port)  # an unusable home: one line, exit 2


# -- storage / adopt --------------------------------------------------------------------


@app.command()
def adopt(
    url: str = typer.Argument(..., help="The mirror: s3://bucket/prefix, gs://, az://, file:///folder."),
    job: List[str] = typer.Option([], "--job", help="A job's global id (or a prefix of it, or its name); repeatable."),
    all_jobs: bool = typer.Option(
        False, "--all", help="Every unfinished job (queued, running, stopped) in the mirror."
    ),
    force: bool = typer.Option(False, "--force", help="Adopt even if its owner's heartbeat is fresh."),
    maps: List[str] = typer.Option([], "--map", help="OLD=NEW: look for input files under OLD at NEW (repeatable)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Adopt without asking (scripts); the list is still printed."),
    wait: bool = typer.Option(
        False, "--wait", help="A job another machine still holds: wait until it is released or goes stale, then adopt."
    ),
    wait_timeout: float = typer.Option(
        3600.0, "--wait-timeout", help="With --wait: give up after this many seconds.", min=1.0
    ),
    gpus: Optional[int] = typer.Option(
        None,
        "--gpus",
        min=0,
        help="Resume on this many GPUs: the checkpoint is resharded and the effective batch kept "
        "(accumulation adjusted; refused when it cannot be).",
    ),
) -> None:
    """Take unfinished jobs over from another machine's mirror and queue them to resume here.
    Each adopted job runs its command here with the daemon's environment: read the list it shows."""
    from .adopt import run_adopt

    raise typer.Exit(
        run_adopt(
            ctx.home.ensure(),
            ctx.config(),
            ctx.store(),
            url,
            jobs=job,
            take_all=all_jobs,
            force=force,
            maps=maps,
            yes=yes,
            wait_s=wait_timeout if wait else None,
            gpus=gpus,
        )
    )


@storage_app.command("check")
def storage_check(
    url: Optional[str] = typer.Argument(None, help="Another URL than [storage] url."),
    mb: float = typer.Option(64.0, "--mb", help="Size of the timed probe upload, MB.", min=1.0),
) -> None:
    """Write, read, conditionally write and delete a probe object; time an upload."""
    from .storage_check import check_storage

    raise typer.Exit(check_storage(ctx.home.ensure(), ctx.config(), url, mb, print))


@app.command()
def watch(
    url: Optional[str] = typer.Argument(None, help="The mirror (default: [storage] url)."),
    once: bool = typer.Option(False, "--once", help="One pass, then exit (for cron)."),
) -> None:
    """The recovery controller: when a job's machine is gone (its lease silent past [storage]
    stale_after_minutes), ask the [recovery] provider for a replacement that adopts it.
    Run it where machines are not reclaimed; it never runs jobs itself."""
    from .watch import run_watch

    raise typer.Exit(run_watch(ctx.home.ensure(), ctx.config(build_notifiers=True), ctx.store(), url, once=once))
