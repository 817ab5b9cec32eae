"""`orch launch JOB.toml [--url URL] [--deadline WHEN]`: the first machine too. The use case is
recovery/launch_job.py; here the command's options, `orch submit`'s own check of the file, and
what is printed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from .context import app, ctx, emit_json


@app.command()
def launch(
    job_toml: Path = typer.Argument(..., help="The job file (what `orch submit` takes)."),
    url: Optional[str] = typer.Option(None, "--url", help="The bucket (default: [storage] url)."),
    deadline: Optional[str] = typer.Option(
        None, "--deadline", help="Finish by (ISO time with a zone, e.g. 2026-12-01T18:00+00:00): overrides the file."
    ),
    as_json: bool = typer.Option(False, "--json", help='Print {"uid", "name", "url"} as JSON.'),
) -> None:
    """Put a job straight into the bucket; `orch watch` places it on a machine (docs/recovery.md)."""
    from ..adopt.plan import storage_for
    from ..model.errors import UsageError
    from ..recovery.launch_job import ANY_SIZE, launch_job
    from ..sweeps.spec import is_sweep_file
    from .job_commands import _preflight

    if is_sweep_file(job_toml):
        raise UsageError(f"{job_toml}: a [sweep] file runs its trials on one machine: `orch submit` it there")
    config = ctx.config()
    # A file:// folder that is not there (a typo, a disk not mounted) would be a new bucket no
    # `orch watch` reads: refused, as `orch storage check` and `orch watch` refuse it.
    section = storage_for(config, url, how="orch launch JOB.toml --url s3://bucket/prefix", must_exist=True)

    def check(path: Path, now: float) -> None:
        _preflight(path, now, ANY_SIZE, config.executor.kind)

    done = launch_job(config, ctx.store(), job_toml, section, deadline, time.time(), check)
    if as_json:
        emit_json({"uid": done.uid, "name": done.name, "url": done.url})
        return
    print(f"launched job {done.uid[:12]} ({done.name}) into {done.url}")
    print("`orch watch` in this home places it on a machine; `orch status --url URL` follows it")
