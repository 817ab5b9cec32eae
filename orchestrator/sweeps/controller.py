"""The daemon's sweep step for one running sweep: tell Optuna how ended trials ended, report the
running trials' newly logged objective and stop the ones the pruner picks (with a checkpoint),
hold the sweep's budget, create trials as the sweep's slots free up, and end the sweep with a
message. Every step reads its facts from the store and the run folders, so a daemon restarted
mid-sweep carries on: an Optuna trial asked but never linked to a job is given its job then."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import Callable, Optional

from ..spec.config import Config
from ..contract import JOB_TOML
from ..cost.money import format_money
from ..model.errors import InvalidTransition
from ..planning.forecast import trial_name
from ..jobs.lifecycle import cancel_job, outgoing_for, write_run_spec
from ..home.paths import Home
from ..model.records import Job
from ..model.states import EventKind, Intent, JobState
from ..store import Store
from . import objective
from ..model.sweep_records import Sweep, SweepState
from .spec import SweepSection, apply_params
from .study import SweepStudy
from .summary import describe_params, summarize

log = logging.getLogger("orch.daemon")

# job state -> how Optuna hears of it
_TOLD = {
    JobState.SUCCEEDED: "complete",
    JobState.PRUNED: "pruned",
    JobState.FAILED: "fail",
    JobState.CANCELLED: "fail",
    JobState.STOPPED: "fail",
    JobState.MOVED: "fail",  # adopted by another machine: this sweep never hears how it ends
}

Stop = Callable[[Job, Intent, str], None]  # record the intent, then SIGTERM (the daemon's signal_job)


@dataclass
class SweepContext:
    store: Store
    config: Config
    home: Home
    stop: Stop
    on_event: Callable[[str, Optional[Job]], None]


_STUDIES: dict[tuple[str, int], SweepStudy] = {}


def study_for(home: Home, sweep: Sweep) -> SweepStudy:
    key = (str(home.root), sweep.id)
    if key not in _STUDIES:
        _STUDIES[key] = SweepStudy(home.root, sweep.id, SweepSection.model_validate(sweep.spec["sweep"]))
    return _STUDIES[key]


def advance_all(ctx: SweepContext, now: float) -> None:
    for sweep in ctx.store.sweeps([SweepState.RUNNING]):
        try:
            advance(ctx, sweep, now)
        except Exception:  # one broken sweep must not stop the daemon's other work
            log.exception("sweep %s: could not advance it", sweep.id)


def advance(ctx: SweepContext, sweep: Sweep, now: float) -> None:
    section = SweepSection.model_validate(sweep.spec["sweep"])
    study = study_for(ctx.home, sweep)
    trials = ctx.store.trials(sweep.id)
    jobs = {t.number: ctx.store.get(t.job_id) for t in trials}
    frozen = study.trials()

    for t in trials:
        job = jobs[t.number]
        run_dir = ctx.home.run_dir(job.id)
        ft = frozen.get(t.number)
        if job.state.is_terminal:
            told = _TOLD[job.state]
            value = objective.final_value(run_dir, section.objective) if told == "complete" else None
            study.tell(t.number, "fail" if told == "complete" and value is None else told, value)
        elif job.state is JobState.RUNNING and ft is not None and job.intent is Intent.NONE:
            for step, value in objective.series(run_dir, section.objective):
                study.report(ft, step, value)
            if section.pruner != "none" and study.should_prune(t.number):
                reached = study.trials()[t.number].last_step
                ctx.stop(
                    job,
                    Intent.PRUNE,
                    f"pruned by the sweep's {section.pruner} pruner at step {reached}: "
                    f"{section.objective} behind the other trials",
                )
        elif job.state is JobState.QUEUED and not (run_dir / JOB_TOML).is_file():
            write_run_spec(ctx.home, job.id, job.spec)  # the daemon died between the insert and this write

    spent = sum(j.cost for j in jobs.values())
    over_budget = section.max_cost is not None and spent >= section.max_cost
    if over_budget:
        _stop_for_budget(ctx, sweep, section, jobs.values(), spent, now)
    if sweep.cancel_requested_at is not None:  # a trial created while `orch sweep cancel` ran is cancelled too
        for job in jobs.values():
            if job.state.is_active and job.cancel_requested_at is None and job.intent is not Intent.CANCEL:
                try:
                    cancel_job(ctx.store, ctx.config, ctx.home, job.id, now)
                except InvalidTransition:
                    pass
        jobs = {n: ctx.store.get(j.id) for n, j in jobs.items()}
    active = [j for j in jobs.values() if j.state.is_active]
    if sweep.cancel_requested_at is None and not over_budget:
        created, linked = len(trials), {t.number for t in trials}
        while len(active) < section.parallel and created < section.trials:
            active.append(_create_trial(ctx, sweep, section, study, linked, now))
            created += 1
    if active:
        return
    if sweep.cancel_requested_at is not None:
        _finish(ctx, sweep, SweepState.CANCELLED, now, "cancelled by the user")
    elif over_budget:
        _finish(
            ctx,
            sweep,
            SweepState.STOPPED,
            now,
            f"its budget of {format_money(section.max_cost or 0, ctx.config.pricing.currency)} is spent",
        )
    elif len(trials) >= section.trials:
        _finish(ctx, sweep, SweepState.SUCCEEDED, now, "")


def _create_trial(
    ctx: SweepContext, sweep: Sweep, section: SweepSection, study: SweepStudy, linked: set[int], now: float
) -> Job:
    # An Optuna trial asked before a crash but never given its job is run now, not asked again.
    orphans = [ft for n, ft in sorted(study.trials().items()) if n not in linked and ft.state.name == "RUNNING"]
    if orphans:
        number, params = orphans[0].number, dict(orphans[0].params)
    else:
        number, params = study.ask()
    linked.add(number)
    base = sweep.spec["job"]
    is_command = "command" in base
    data = apply_params(base, params, is_command=is_command)
    data["name"] = trial_name(sweep.name, number)  # the estimate finds earlier trials by it
    budget = data.get("budget") or {}
    job = ctx.store.submit_trial(
        sweep.id,
        number,
        params,
        now,
        name=data["name"],
        kind="command" if is_command else "builtin",
        gpus=data.get("gpus", 1),
        priority=data.get("priority", 0),
        retries=data.get("retries", 2),
        spec=data,
        spec_path=sweep.spec["job_path"],
        max_cost=budget.get("max_cost"),
        max_hours=budget.get("max_hours"),
        detail=f"trial {number} of sweep {sweep.id} ({describe_params(params)})",
    )
    write_run_spec(ctx.home, job.id, data)
    log.info("sweep %s: trial %s is job %s (%s)", sweep.id, number, job.id, describe_params(params))
    return job


def _stop_for_budget(ctx: SweepContext, sweep: Sweep, section: SweepSection, jobs, spent: float, now: float) -> None:
    money = format_money(section.max_cost or 0, ctx.config.pricing.currency)
    reason = f"sweep {sweep.id}'s budget of {money} is spent ({format_money(spent, ctx.config.pricing.currency)})"
    for job in jobs:
        if job.state is JobState.RUNNING and job.intent is Intent.NONE:
            ctx.stop(job, Intent.BUDGET, reason)
        elif job.state is JobState.QUEUED:
            try:
                cancel_job(ctx.store, ctx.config, ctx.home, job.id, now)
            except InvalidTransition:
                pass


def _finish(ctx: SweepContext, sweep: Sweep, state: SweepState, now: float, reason: str) -> None:
    if not ctx.store.finish_sweep(sweep.id, state, now, reason=reason):
        return
    _STUDIES.pop((str(ctx.home.root), sweep.id), None)
    summary = summarize(ctx.store, ctx.home, ctx.store.sweep(sweep.id))
    currency = ctx.config.pricing.currency
    best = summary["best"]
    if best:
        text = (
            f"best trial: job {best['trial']} ({describe_params(best['params'])}), "
            f"{summary['objective']}={best['value']:.4g}"
        )
    else:
        text = "no trial finished"
    text += (
        f"; {len(summary['trials'])} trials, {summary['steps_total']} steps, cost "
        f"{format_money(summary['cost_total'], currency)}; {summary['pruned']} pruned, saving "
        f"{format_money(summary['saved'], currency)}"
    )
    if reason:
        text = f"{reason}; {text}"
    payload = {
        "event": EventKind.SWEEP_FINISHED.value,
        "job_id": None,
        "job_name": f"sweep {sweep.id} ({sweep.name})",
        "state": state.value,
        "reason": text,
        "cost": round(summary["cost_total"], 4),
        "currency": currency,
        "best_metric": f"{summary['objective']}={best['value']:.4g}" if best else "",
        "host": socket.gethostname(),
    }
    ctx.store.record_event(
        None,
        EventKind.SWEEP_FINISHED,
        now,
        detail=f"sweep {sweep.id}: {text}",
        outgoing=outgoing_for(ctx.config, EventKind.SWEEP_FINISHED, payload),
    )
    log.info("sweep %s (%s) %s: %s", sweep.id, sweep.name, state.value, text)
    ctx.on_event(EventKind.SWEEP_FINISHED.value, None)
