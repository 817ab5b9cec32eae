"""`orch submit SWEEP.toml` (a file with a [sweep] table), `orch sweep show ID [--json]` and
`orch sweep cancel ID`. The daemon creates and prunes the trials; the CLI records intent."""

from __future__ import annotations

import sys

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import typer

from ..cost.money import format_duration, format_money
from .context import app, ctx, currency, daemon_pid, emit_json, err, poke

if TYPE_CHECKING:
    from ..home.paths import Home

sweep_app = typer.Typer(
    no_args_is_help=True, help="Look at or cancel a sweep (submit one with `orch submit sweep.toml`)."
)
app.add_typer(sweep_app, name="sweep")


def admit_sweep(
    path: Path, section: Any, base: Any, config: Any, *, python: Optional[str] = None, home: Optional[Home] = None
) -> None:
    """The one admission check (jobs/admission.py) for a sweep's base job, for `orch submit` and
    `orch estimate` alike; no deadline check: the trials start later."""
    from ..jobs.admission import admit
    from ..planning.capacity import gpu_slots
    from ..sweeps.spec import preflight_checks

    admit(
        base,
        section.job,
        machine_gpus=len(gpu_slots(config)),
        executor=config.executor.kind,
        now=None,
        preflight_checks=preflight_checks(section, base, str(path)),
        note=err,
        python=python,
        home=home,
    )


def submit_sweep(
    path: Path,
    as_json: bool,
    *,
    priority: Optional[int] = None,
    after: Sequence[int] = (),
    at: Optional[str] = None,
    estimate: bool = False,
    yes: bool = False,
) -> None:
    from ..model.errors import UsageError
    from ..sweeps.spec import load_sweep

    unused = [flag for flag, given in (("--after", bool(after)), ("--at", at is not None)) if given]
    if unused:
        raise UsageError(
            f"{path}: {', '.join(unused)} {'is' if len(unused) == 1 else 'are'} for a single job; a sweep "
            "starts its trials as its `parallel` slots free up (submit the sweep later to delay it)"
        )
    section, base = load_sweep(path)
    if priority is not None:  # every trial's priority
        base = base.model_copy(update={"priority": priority})
    config = ctx.config(build_notifiers=True)  # the checks `config check` and the daemon's start make
    admit_sweep(
        path,
        section,
        base,
        config,
        python=ctx.home.job_python(sys.executable),  # the trials run with the daemon's Python
        home=ctx.home,  # its warm pre-flight, when it runs
    )
    if estimate:
        from ..jobs.estimate import estimate_data
        from ..planning.speed_range import sweep_bound
        from .estimate import ask_after

        data = estimate_data(
            ctx.store(),
            ctx.home,
            config,
            Path(section.job),
            time.time(),
            daemon_running=daemon_pid(ctx.home) is not None,
            sweep=section.name or path.stem,  # the name the sweep below is created with
        )
        data["sweep"] = sweep_bound(data, section, config)
        ask_after(data, yes)
    spec = {
        "sweep": section.model_dump(mode="json", by_alias=True),
        "job": base.to_toml_dict(),
        "job_path": section.job,
    }
    sweep = ctx.store().create_sweep(
        name=section.name or path.stem, spec=spec, spec_path=str(path.resolve()), now=time.time()
    )
    running = poke(ctx.home)
    if as_json:
        emit_json({"id": sweep.id, "name": sweep.name, "state": sweep.state.value, "kind": "sweep"})
    else:
        print(
            f"submitted sweep {sweep.id} ({sweep.name}): {section.trials} trials, {section.parallel} at a time, "
            f"{section.sampler} sampler, " + ("no pruner" if section.pruner == "none" else f"{section.pruner} pruner")
        )
    if not running:
        err("note: no daemon is running; start one with `orch daemon start` (the daemon creates the trials)")


@sweep_app.command("show")
def show(
    sweep_id: int = typer.Argument(...), as_json: bool = typer.Option(False, "--json", help="Print the sweep as JSON.")
) -> None:
    """The trials best first (params, state, objective, steps, cost), the best trial, and what pruning saved."""
    from ..sweeps.summary import summarize

    store = ctx.store()
    summary = summarize(store, ctx.home, store.sweep(sweep_id))
    if as_json:
        emit_json(summary)
    else:
        print(render(summary, currency()))


def render(s: dict[str, Any], currency: str) -> str:
    from ..sweeps.summary import describe_params

    arrow = "higher is better" if s["direction"] == "maximize" else "lower is better"
    lines = [
        f"sweep {s['id']} ({s['name']}): {s['state']}, {len(s['trials'])} of {s['trials_planned']} trials; "
        f"{s['objective']} ({arrow})"
    ]
    if s["reason"]:
        lines.append(f"  {s['reason']}")
    best = s["best"]
    lines.append(
        f"  best: job {best['trial']} {s['objective']}={best['value']:.4g} ({describe_params(best['params'])})"
        if best
        else "  best: no trial has finished yet"
    )
    lines.append(
        f"  spent: {s['steps_total']} steps, {format_money(s['cost_total'], currency)}; "
        f"pruned {s['pruned']}, saving {format_money(s['saved'], currency)} "
        f"({format_duration(s['saved_seconds'])} of running time)"
    )
    lines.append("")
    lines.append(f"  {'job':>5}  {'state':<10} {s['objective']:>12} {'steps':>7} {'cost':>10}  params")
    for t in s["trials"]:
        value = f"{t['value']:.4g}" if t["value"] is not None else "-"
        lines.append(
            f"  {t['id']:>5}  {t['state']:<10} {value:>12} {t['steps']:>7} "
            f"{format_money(t['cost'], currency):>10}  {describe_params(t['params'])}"
        )
    return "\n".join(lines)


@sweep_app.command("cancel")
def cancel(sweep_id: int = typer.Argument(...)) -> None:
    """Cancel a sweep: no new trials; queued trials cancelled at once, running ones checkpoint and stop."""
    from ..sweeps.cancel import cancel_sweep

    result = cancel_sweep(ctx.store(), ctx.config(), ctx.home, sweep_id, time.time())
    stopping = result.stopping
    alive = poke(ctx.home)
    print(
        f"cancelling sweep {sweep_id} ({result.name}): no new trials"
        + (f"; {stopping} running trial{'s' if stopping != 1 else ''} checkpoint and stop" if stopping else "")
    )
    if not alive:
        err("note: no daemon is running; the sweep ends when one starts (`orch daemon start`)")
