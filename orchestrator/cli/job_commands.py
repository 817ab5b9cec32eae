"""`orch submit`, `run`, `status`, `show`, `logs`, `cancel`, `retry`, `cost`: the verbs on jobs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from ..model.errors import OrchError
from ..model.executor_kinds import LOCAL
from ..home.paths import Home
from .context import app, ctx, currency, daemon_pid, emit_json, err, poke


# -- submit / run -----------------------------------------------------------------------


@app.command()
def submit(
    job_toml: Path = typer.Argument(..., help="The job file (see examples/)."),
    priority: Optional[int] = typer.Option(
        None, "--priority", min=-(2**63), max=2**63 - 1, help="Higher runs first (overrides the file)."
    ),
    after: List[int] = typer.Option([], "--after", help="Start only after job ID succeeded (repeatable)."),
    at: Optional[str] = typer.Option(None, "--at", help="Hold until a time: 2026-12-01T02:00 (local), or +30m, +2h."),
    as_json: bool = typer.Option(False, "--json", help='Print {"id", "name", "state"} as JSON.'),
    estimate_first: bool = typer.Option(
        False, "--estimate", help="Print `orch estimate` for it and ask before queueing."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --estimate: queue without asking."),
) -> None:
    """Validate a job file and queue it (a file with a [sweep] table queues a sweep)."""
    from ..jobs.lifecycle import submit_job
    from ..planning.capacity import gpu_slots
    from ..sweeps.spec import is_sweep_file
    from .when import parse_at

    if is_sweep_file(job_toml):  # a [sweep] table: the daemon makes its trials (cli/sweep_commands.py)
        from .sweep_commands import submit_sweep

        return submit_sweep(job_toml, as_json, priority=priority, after=after, at=at, estimate=estimate_first, yes=yes)
    now = time.time()
    not_before = parse_at(at, now) if at else None
    config = ctx.config(build_notifiers=True)  # the checks `config check` and the daemon's start make
    store = ctx.store()
    machine_gpus = len(gpu_slots(config))  # the one GPU capacity (planning/capacity.py)
    # checked in the Python the daemon runs built-in jobs with, not the CLI's own
    _preflight(
        job_toml, now, machine_gpus, config.executor.kind, python=ctx.home.job_python(sys.executable), home=ctx.home
    )
    if estimate_first:
        from ..jobs.estimate import estimate_data
        from .estimate import ask_after

        ask_after(
            estimate_data(store, ctx.home, config, job_toml, now, daemon_running=daemon_pid(ctx.home) is not None), yes
        )
        now = time.time()
    job = submit_job(
        store,
        config,
        ctx.home,
        job_toml,
        now=now,
        priority=priority,
        after=after,
        not_before=not_before,
        machine_gpus=machine_gpus,
    )
    running = poke(ctx.home)
    if as_json:
        emit_json({"id": job.id, "name": job.name, "state": job.state.value})
    else:
        print(f"submitted job {job.id} ({job.name})")
    from ..jobs.repeat import repeat_note
    from ..model.states import JobState

    repeated = repeat_note(job, store.jobs([JobState.QUEUED, JobState.RUNNING]), time.time())
    if repeated:
        err(repeated)
    if not running:
        err("note: no daemon is running; start one with `orch daemon start` (or run it now with `orch run`)")


def _preflight(
    job_toml: Path,
    now: Optional[float],
    machine_gpus: int,
    executor: str,
    python: Optional[str] = None,
    home: Optional[Home] = None,
) -> None:
    """Everything a job file can be refused for, before it is queued or a probe is paid for:
    jobs/admission.py's one check (the file's own checks, then the built-in job's pre-flight, in
    `python`: the interpreter the job will run with; `now` None: no deadline check)."""
    from ..jobs.admission import admit
    from ..jobs.preflight import Check
    from ..spec.jobspec import load_jobspec
    from ..sweeps.spec import placeholder_problems

    spec = load_jobspec(job_toml)
    label = str(job_toml)
    admit(
        spec,
        label,
        machine_gpus=machine_gpus,
        executor=executor,
        now=now,
        also=placeholder_problems(spec, label),
        preflight_checks=[Check(label, spec.to_toml_dict())],
        note=err,
        python=python,
        home=home,  # the daemon's warm pre-flight, when it runs
    )


@app.command()
def estimate(
    job_toml: Path = typer.Argument(..., help="The job file."),
    as_json: bool = typer.Option(False, "--json", help="The same fields as JSON."),
    warmup: int = typer.Option(10, "--warmup", min=1, help="Probe: optimizer steps before the clock starts."),
    steps: int = typer.Option(30, "--steps", min=1, help="Probe: optimizer steps measured."),
) -> None:
    """What a job will take and cost here, before it is queued: a short probe of a built-in job
    (steps/s, wall time, GPU-hours, cost, checkpoints, preemption waste, the wait), or a command
    job's history. A sweep file gets its base job's estimate and the sweep's bound (every trial
    run to its end)."""
    from ..planning.capacity import gpu_slots
    from ..sweeps.spec import is_sweep_file, load_sweep
    from ..jobs.estimate import estimate_data, public
    from ..planning.speed_range import sweep_bound
    from ..views.estimate import estimate_text
    from .sweep_commands import admit_sweep

    # What submit would refuse, before a probe is paid for (the instant checks, then the
    # pre-flight); no deadline check: an estimate is how to choose one.
    section, config = None, ctx.config()
    if is_sweep_file(job_toml):
        section, base = load_sweep(job_toml)
        admit_sweep(job_toml, section, base, config)
    else:
        _preflight(job_toml, None, len(gpu_slots(config)), config.executor.kind)
    data = estimate_data(
        ctx.store(),
        ctx.home,
        config,
        Path(section.job) if section else job_toml,
        time.time(),
        warmup=warmup,
        steps=steps,
        daemon_running=daemon_pid(ctx.home) is not None,
        sweep=(section.name or job_toml.stem) if section else None,  # its trials' names, as submit names them
    )
    if section:
        data["sweep"] = sweep_bound(data, section, config)
    if as_json:
        emit_json(public(data))
    else:
        print(estimate_text(data))


@app.command()
def run(
    job_toml: Optional[Path] = typer.Argument(None, help="The job file."),
    resume: Optional[int] = typer.Option(None, "--resume", help="Continue job ID from its latest checkpoint."),
) -> None:
    """Record a job like submit, then run it here in the foreground (no daemon)."""
    from ..foreground.supervisor import run_foreground
    from ..planning.capacity import machine_gpus

    if (job_toml is None) == (resume is None):
        raise typer.BadParameter("give a job file or --resume ID (one of them)")
    if job_toml is not None:  # the same checks as submit, before anything is recorded; it runs here
        _preflight(job_toml, time.time(), len(machine_gpus(ctx.config())), LOCAL)
    _refuse_when_the_total_budget_is_spent()
    code = run_foreground(ctx.home.ensure(), ctx.store(), ctx.config(), job_toml=job_toml, resume_id=resume, say=err)
    raise typer.Exit(code)


def _refuse_when_the_total_budget_is_spent() -> None:
    """What a daemon does to queued jobs while config.toml's [budget] total is spent (it holds
    them), `orch run` does before it records or starts one: nothing runs, exit 1."""
    from ..jobs.budget_stop import total_budget_reason

    reason = total_budget_reason(ctx.store(), ctx.config())
    if reason:
        err(f"orch run: {reason}; nothing was started. Raise [budget] total in config.toml to go on")
        raise typer.Exit(1)


# -- looking at jobs --------------------------------------------------------------------


@app.command()
def status(
    show_all: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    as_json: bool = typer.Option(False, "--json", help="A JSON list, one object per job."),
    url: Optional[str] = typer.Option(None, "--url", help="A bucket's jobs instead: market, machine, state."),
) -> None:
    """The queue: id, name, state, attempt, progress, ETA, runtime, cost."""
    if url is not None:
        from .bucket_status import show_bucket_status

        return show_bucket_status(ctx.config(), url, as_json)
    from ..views.queue_view import queue_view

    home = ctx.home
    store = ctx.store()
    rows = queue_view(store, home, time.time(), include_all=show_all, config=_config_once())
    if as_json:
        emit_json(rows)
        return
    from .watch import status_note

    if not rows:
        print("no jobs" + ("" if show_all else " queued or running (`orch status --all` shows finished ones)"))
        status_note(store)  # `orch watch` runs from this home: the jobs it waits on a machine for
        _say_draining(home)
        return
    import os
    import shutil

    from ..views.render import status_table
    from ..views.sweeps import grouped_table

    tty = sys.stdout.isatty()
    cur, color = currency(), tty and not os.environ.get("NO_COLOR")
    width = shutil.get_terminal_size().columns if tty else None
    print(grouped_table(store, rows, lambda some: status_table(some, cur, color=color, width=width)))
    if daemon_pid(home) is None and any(r["state"] in ("queued", "running") for r in rows):
        err("note: no daemon is running; `orch daemon start` runs the queue")
        from ..jobs.runners import runnerless_jobs

        for job in runnerless_jobs(store):
            err(
                f"note: job {job.id} is recorded running but nothing runs it (its "
                + ("`orch run`" if job.in_foreground else "supervisor")
                + f" is gone): `orch run --resume {job.id}` continues it here, or `orch daemon start`"
            )
    status_note(store)
    _say_draining(home)


def _say_draining(home: Home) -> None:
    from ..home.drain import requested

    if requested(home) is not None and daemon_pid(home) is not None:
        err("note: the daemon is draining: running jobs finish, nothing new starts, then it exits")


@app.command()
def show(
    job_id: int = typer.Argument(...),
    as_json: bool = typer.Option(False, "--json"),
    reveal: bool = typer.Option(False, "--reveal", help="Show [env] values (masked as *** otherwise)."),
) -> None:
    """A job's spec, state, provenance, attempts, checkpoints, cost and event history."""
    from ..views.job_view import job_view
    from ..views.render import show_text

    data = job_view(ctx.store(), ctx.home, job_id, time.time(), config=_config_once(), reveal=reveal)
    if as_json:
        emit_json(data)
    else:
        print(show_text(data, data["currency"]))


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
    from ..jobs.lifecycle import cancel_job

    config = ctx.config()
    job, done = cancel_job(ctx.store(), config, ctx.home, job_id, time.time())
    if done:
        print(f"cancelled job {job.id} ({job.name})")
        return
    alive = poke(ctx.home)
    from ..jobs.attempts import grace_for

    print(f"cancelling job {job.id} ({job.name}): SIGTERM now, SIGKILL after {grace_for(job, config):g}s")
    if not alive:
        err("note: no daemon is running; the cancel happens when one starts (`orch daemon start`)")


@app.command()
def retry(
    job_id: int = typer.Argument(...),
    budget: Optional[float] = typer.Option(None, "--budget", help="A new max_cost for the job.", min=0.0),
    hours: Optional[float] = typer.Option(None, "--hours", help="A new max_hours for the job.", min=0.0),
    accept_env: bool = typer.Option(
        False,
        "--accept-env",
        help="Go on in the environment as it is now: later attempts are compared with it instead of the "
        'first attempt\'s (after an on_env_change = "stop").',
    ),
    gpus: Optional[int] = typer.Option(
        None,
        "--gpus",
        min=0,
        help="Resume on this many GPUs: the checkpoint is resharded and the effective batch kept "
        "(accumulation adjusted; refused when it cannot be).",
    ),
) -> None:
    """Put a failed, cancelled or stopped job back in the queue; it resumes from its latest checkpoint."""
    from ..jobs.lifecycle import retry_job

    if accept_env:
        accept_current_environment(job_id)
    job = retry_job(ctx.store(), ctx.config(), ctx.home, job_id, time.time(), budget=budget, hours=hours, gpus=gpus)
    print(f"job {job.id} ({job.name}) queued again; it resumes from its latest checkpoint")
    if not poke(ctx.home):
        err("note: no daemon is running; start one with `orch daemon start`")


def accept_current_environment(job_id: int) -> None:
    import os

    from ..host.env_record import accept_environment
    from ..jobs.attempts import attempt_command
    from ..model.states import RETRYABLE

    job, home = ctx.store().get(job_id), ctx.home
    if job.state not in RETRYABLE:
        return  # retry_job says why it cannot be retried
    run_dir = home.run_dir(job_id)
    # The next attempt's own command and environment ([env], pass_env, instrument), as the daemon builds them.
    command = attempt_command(run_dir, job, job.attempt + 1, [], os.environ)
    argv, env, cwd = command.argv, command.env, command.cwd
    problem = accept_environment(run_dir, argv, env, cwd)
    if problem:
        raise OrchError(f"job {job_id}: cannot record the environment to accept: {problem}")
    err(f"job {job_id}: later attempts are compared with the environment as it is now")


@app.command()
def cost(
    as_json: bool = typer.Option(False, "--json"),
    breakdown: bool = typer.Option(
        False,
        "--breakdown",
        help="Where the money went: the goodput ledger summed "
        "over jobs (useful, redone, checkpoint, start-up, data wait, eval) and idle.",
    ),
) -> None:
    """Per-job and total cost, GPU-hours, idle cost and preemption waste."""
    from ..views.cost_report import cost_data, cost_table

    if breakdown:
        from ..views.bill import breakdown_data, breakdown_table

        data = breakdown_data(ctx.store(), ctx.home, ctx.config(), time.time())
        if as_json:
            emit_json(data)
        else:
            print(breakdown_table(data))
        return
    data = cost_data(ctx.store(), ctx.config())
    if as_json:
        emit_json(data)
    else:
        print(cost_table(data))


def _config_once() -> Callable[[], Any]:
    """config.toml, or None when there is none or it does not load (`orch status` and `orch show`
    still work): read at most once per command, and only when first asked for."""
    cache: list[Any] = []

    def config() -> Any:
        if not cache:
            value = None
            if ctx.config_arg is not None or ctx.config_path.exists():
                try:
                    value = ctx.config()
                except OrchError:
                    value = None
            cache.append(value)
        return cache[0]

    return config
