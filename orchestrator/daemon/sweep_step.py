"""The tick's sweep step. With no sweep running it is one small query and optuna is never
imported (the daemon's idle footprint stays as it was); with one, the controller in
orchestrator/sweeps/ proposes, prunes and ends trials, signalling through the stop-requests step."""

from __future__ import annotations

from . import stop_requests
from .step_context import StepContext


def advance_sweeps(d: StepContext, now: float) -> None:
    if not d.store.has_running_sweep():
        return
    from ..sweeps.controller import SweepContext, advance_all  # imports optuna: only while a sweep runs

    ctx = SweepContext(
        store=d.store,
        config=d.config,
        home=d.home,
        on_event=d.on_event,
        stop=lambda job, intent, reason: stop_requests.signal_job(d, job, intent, now, reason),
    )
    advance_all(ctx, now)
