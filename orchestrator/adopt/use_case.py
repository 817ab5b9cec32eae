"""`orch adopt URL`'s use case: choose the jobs, check and preview them, ask once, then adopt each
in turn, and the command's exit code."""

from __future__ import annotations

import functools
import os
import time
from typing import Callable, Optional

from ..spec.config import Config
from ..model.errors import OrchError, UsageError
from ..objectstore import manifest as mf
from ..objectstore.remote import Remote, StorageError
from ..objectstore.signing import keys_from
from ..home.paths import Home
from ..jobs.lifecycle import machine_outgoing
from ..model.records import Outgoing
from ..model.states import EventKind
from ..planning.capacity import gpu_slots
from ..store import Store
from .candidates import Held, Refused, Untrusted, choose
from .import_job import Adopted, adopt_one
from .pending import move_for_holder, park
from .plan import Plan, check, parse_maps, preview, storage_for


def adopt_jobs(
    home: Home,
    config: Config,
    store: Store,
    url: Optional[str],
    *,
    wanted: list[str],
    take_all: bool,
    force: bool,
    say: Callable[[str], None],
    warn: Callable[[str], None],
    confirm: Callable[[list[str]], bool],
    now: Optional[float] = None,
    maps: Optional[list[str]] = None,
    park_held: bool = True,
    gpus: Optional[int] = None,
) -> tuple[list[Adopted], list[Refused]]:
    """Returns (adopted jobs, refusals). `confirm` is shown what each job runs and says whether
    to go on. Raises OrchError for a store that cannot be read. `park_held`: a job held by the
    machine a planned move takes it from is left pending here (pending.py), not refused.
    `gpus`: `--gpus N`, each job resumed on N GPUs; without it a job asking for more GPUs than this
    machine has resumes on fewer when its `min_gpus` allows (plan.gpu_count)."""
    if not wanted and not take_all:
        raise UsageError("say which jobs: --job ID (repeatable) or --all")
    mapping = parse_maps(maps or [])
    section = storage_for(config, url, must_exist=True)  # a mistyped folder is not "no jobs"
    keys = keys_from(section, os.environ)  # storage_for refused a key named but missing
    remote = Remote(section)
    home_id = mf.home_identity(home)
    try:
        chosen = choose(remote, wanted, take_all, keys)
    except StorageError as exc:
        raise OrchError(f"cannot read the mirror: {exc}") from None
    if not chosen:
        say(f"no unfinished jobs in {section.url}")
        return [], []
    plans: list[Plan] = []
    refused: list[Refused] = []

    @functools.cache
    def machine_gpus() -> int:  # nvidia-smi at most once, and only for a job that gets this far
        return len(gpu_slots(config))

    for cand in chosen:
        try:
            plans.append(
                check(
                    store,
                    section,
                    cand,
                    home_id,
                    force=force,
                    mapping=mapping,
                    now=time.time() if now is None else now,
                    keys=keys,
                    gpus=gpus,
                    available=machine_gpus,
                )
            )
        except Held as exc:
            move = move_for_holder(remote, cand.uid, exc.holder_home) if park_held else None
            if move is None:
                refused.append(exc)
                warn(f"refused: {exc}")
                continue
            park(home, remote.url.raw, cand.uid, list(maps or []), move, time.time() if now is None else now, gpus=gpus)
            say(
                f"pending: {cand.label} is held by the machine {move} takes it from; this machine's daemon "
                "adopts it when that machine hands it over (`orch daemon start`; `orch adopt --wait` waits here)"
            )
        except Refused as exc:
            refused.append(exc)
            warn(f"refused: {exc}")
            if isinstance(exc, Untrusted):
                _report_untrusted(config, store, exc, time.time() if now is None else now)
    if not plans:
        return [], refused
    for plan in plans:
        if plan.note:
            warn(plan.note)
    if not confirm(preview(plans)):
        return [], refused
    adopted = []
    for plan in plans:
        t = time.time() if now is None else now
        try:
            result = adopt_one(
                home, store, remote, plan, home_id, now=t, warn=warn, outgoing=_adopted_outgoing(config, plan)
            )
        except (Refused, StorageError) as exc:
            why = exc if isinstance(exc, Refused) else Refused(f"{plan.cand.label}: {exc}")
            refused.append(why)
            warn(f"refused: {why}")
            continue
        adopted.append(result)
        where = (
            f"resuming from step {result.step} ({result.checkpoint}, sha256 verified)"
            if result.checkpoint
            else "starting from scratch (no checkpoint mirrored)"
        )
        on = f" on {plan.gpus} GPU(s) (was {(plan.cand.manifest or {}).get('gpus')})" if plan.resized else ""
        say(f"adopted {result.uid[:12]} ({result.name}) as job {result.job_id}{on}: {where}")
    return adopted, refused


def exit_code(adopted: list[Adopted], refused: list[Refused]) -> int:
    if not refused:
        return 0
    if not adopted and all(r.exit_code == 2 for r in refused):
        return 2
    return 1


def _adopted_outgoing(config: Config, plan: Plan) -> Callable[[str], list[Outgoing]]:
    """The `adopted` event's notifications (the daemon here delivers them)."""

    def build(detail: str) -> list[Outgoing]:
        rows = machine_outgoing(config, EventKind.ADOPTED, detail)
        for row in rows:
            row.payload.update(job_name=str((plan.cand.manifest or {}).get("name") or ""), state="queued")
        return rows

    return build


def _report_untrusted(config: Config, store: Store, refusal: Untrusted, now: float) -> None:
    """The `untrusted` event and its notifications, once per job and manifest content (a bootstrap
    that retries `orch adopt` reports a forged manifest once)."""
    detail = str(refusal)
    store.recovery_event(
        f"adopt:{refusal.key}",
        EventKind.UNTRUSTED.value,
        detail,
        now,
        machine_outgoing(config, EventKind.UNTRUSTED, detail),
    )
