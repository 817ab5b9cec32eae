"""`orch watch`: one pass over the mirror's jobs, and the loop that repeats it.

For each unfinished job whose owner lease has been silent longer than [storage]
stale_after_minutes and was not released, the controller
  1. asks the provider whether the old machine is gone (False: leave it; None/True: go on),
  2. queues `machine_lost` (once per lapsed lease),
  3. refuses past `max_launches` or what `max_cost` can pay for (one `relaunch_failed`),
  4. chooses the market (market.py),
  5. claims launch n in the mirror, create-only (claims.py), BEFORE calling the provider,
  6. reads the manifest again: a lease that came back to life cancels the claim,
  7. calls the provider: `relaunched`, or `relaunch_failed` and a backoff before the next claim.
A claim that did not lead to an adoption within `launch_timeout_minutes` (the controller died
mid-launch, or the machine never came up) is followed by the next claim. The controller never runs a job."""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..jobs.backoff import backoff_s
from ..spec.config import Config
from ..model.errors import OrchError
from ..redaction import redact
from ..spec.jobspec import deadline_ts
from ..jobs.lifecycle import outgoing_for
from ..objectstore import manifest as mf
from ..objectstore.manifest_model import MAX_MANIFEST_BYTES, ManifestError
from ..objectstore.manifest_model import parse as parse_manifest
from ..objectstore.remote import Conflict, Remote, StorageError, TooLarge
from ..model.states import EventKind
from ..store import Store
from ..objectstore import claims as cl
from . import market as mk
from .provider import LaunchRequest, Provider, RelaunchError

log = logging.getLogger("orch.watch")

UNFINISHED = ("queued", "running")  # a stopped job stays stopped: the user stopped it
MAX_BACKOFF_S = 1800.0

# What a job is doing, as `orch watch` and `orch status` in the controller's home say it.
ALIVE, WAITING, LAUNCHING, LEFT, RELEASED, DONE, UNREADABLE = (
    "alive",
    "waiting",  # for a replacement machine (since `waiting_since`)
    "launching",
    "left alone",
    "released",
    "finished",
    "unreadable",
)


@dataclass
class JobView:
    uid: str
    name: str
    state: str
    note: str = ""
    waiting_since: Optional[float] = None
    launches: int = 0
    losses: int = 0
    market: str = ""


class Controller:
    def __init__(
        self,
        config: Config,
        store: Store,
        remote: Remote,
        provider: Provider,
        *,
        controller_id: str,
        clock: Callable[[], float] = time.time,
        say: Callable[[str], None] = lambda s: None,
    ):
        assert config.recovery is not None
        self.config = config
        self.rc = config.recovery
        self.store = store
        self.remote = remote
        self.provider = provider
        self.controller_id = controller_id
        self.clock = clock
        self.say = say
        self.stale_after_s = config.storage.stale_after_minutes * 60
        self.launch_timeout_s = self.rc.launch_timeout_minutes * 60
        self.host = socket.gethostname()
        self._shown: dict[str, tuple[Any, ...]] = {}  # uid -> what the store last got

    # -- one pass -----------------------------------------------------------------------------

    def pass_once(self) -> list[JobView]:
        """Look at every job in the mirror once; launch where a lease lapsed. Raises StorageError
        when the mirror cannot be listed (the loop retries at the next poll)."""
        views = []
        for uid in sorted(self.remote.list_dirs("jobs")):
            try:
                view = self._job(uid)
            except StorageError as exc:  # one job's objects unreadable now: the others still go
                view = JobView(uid, "", UNREADABLE, f"cannot read the mirror: {exc}")
            if view is None:
                continue
            views.append(view)
            shown = (view.name, view.state, view.waiting_since, view.launches, view.losses, view.market, view.note)
            if self._shown.get(uid) == shown:
                continue  # nothing new: no write
            self._shown[uid] = shown
            self.store.recovery_set(
                uid,
                self.clock(),
                name=view.name,
                url=self.remote.url.raw,
                state=view.state,
                waiting_since=view.waiting_since,
                launches=view.launches,
                losses=view.losses,
                market=view.market,
                note=view.note,
            )
        return views

    def _read(self, uid: str) -> Optional[tuple[dict[str, Any], Optional[str]]]:
        key = mf.manifest_key(uid)
        try:
            got = self.remote.get_with_etag(key, max_bytes=MAX_MANIFEST_BYTES)
        except TooLarge:
            return None
        if got is None:
            return None
        try:
            return parse_manifest(got[0], self.remote.where(key), uid), got[1]
        except ManifestError:
            return None

    def _job(self, uid: str) -> Optional[JobView]:
        read = self._read(uid)
        if read is None:
            return None
        m, _ = read
        name = str(m.get("name") or "")
        if m.get("state") not in UNFINISHED:
            return JobView(uid, name, DONE, str(m.get("state")))
        own = dict(m.get("owner") or {})
        claims = cl.read_claims(self.remote, uid)
        launches = len(claims)
        losses = _losses(claims)
        view = JobView(uid, name, ALIVE, launches=launches, losses=losses)
        if own.get("released"):
            view.state, view.note = RELEASED, "its lease was released by a clean stop; not relaunched"
            return view
        now = self.clock()
        age = mf.lease_age(m, now)
        latest = claims[-1] if claims else None
        if age is not None and age < self.stale_after_s:
            came_back = latest is not None and latest.lost.get("home_id") == own.get("home_id")
            if latest is not None and latest.status == cl.CLAIMED and came_back:
                # The machine we thought lost heartbeats again (a slow heartbeat, a network blip).
                self._cancel(latest, "the lease came back to life")
            elif latest is not None and latest.status == cl.CLAIMED:
                # Another machine took the job while the claim was open: the launch happened,
                # though the controller that made it died before it could say so.
                latest.status, latest.updated_at = cl.LAUNCHED, now
                latest.launched = f"adopted by {own.get('host') or '?'}"
                self._update(latest)
                self._event(
                    f"{uid}:launch:{latest.n}",
                    EventKind.RELAUNCHED,
                    m,
                    f"job {uid[:12]} ({name}): launch {latest.n} on {latest.market} came up: {latest.launched}",
                )
            view.note = f"lease held by {own.get('host') or '?'}"
            return view
        # The lease has lapsed (or there never was one).
        lost_at = float(own.get("heartbeat") or m.get("written_at") or now)
        view.state, view.waiting_since = WAITING, lost_at
        if latest is not None and latest.for_loss(own) and latest.status != cl.CANCELLED:
            if latest.status == cl.CLAIMED and now - latest.claimed_at < self.launch_timeout_s:
                view.state, view.market = LAUNCHING, latest.market
                view.note = f"launch {latest.n} claimed by {latest.controller[:12]} (in progress)"
                return view
            if latest.status == cl.LAUNCHED and now - latest.updated_at < self.launch_timeout_s:
                view.market = latest.market
                view.note = f"launch {latest.n} ({latest.market}) is coming up: {latest.launched}"
                return view
            if latest.status == cl.FAILED:
                failed_in_row = _failures_in_row(claims, own)
                due = latest.updated_at + backoff_s(failed_in_row - 1, self.rc.poll_seconds, MAX_BACKOFF_S)
                if now < due:
                    view.note = f"launch {latest.n} failed; next try in {due - now:.0f} s: {latest.error[:200]}"
                    return view
            if latest.status == cl.LAUNCHED:  # it never took the job: that machine is lost too
                losses += 1
                view.losses = losses
        else:
            # A new loss: ask the provider, then say so once.
            gone = self._gone(own)
            if gone is False:
                view.state = ALIVE
                view.note = (
                    f"lease silent {age or 0:.0f} s, but the {self.provider.name} provider says the machine is up"
                )
                return view
            losses += 1
            view.losses = losses
            self._event(
                f"{uid}:lost:{cl.lost_identity(own)}",
                EventKind.MACHINE_LOST,
                m,
                f"job {uid[:12]} ({name}): the lease of host {own.get('host') or '?'} has been silent "
                f"{age or 0:.0f} s (stale after {self.stale_after_s:.0f} s)",
            )
        if launches >= self.rc.max_launches:
            view.state = LEFT
            view.note = f"{launches} launch(es), max_launches = {self.rc.max_launches}: left alone"
            self._event(
                f"{uid}:max",
                EventKind.RELAUNCH_FAILED,
                m,
                f"job {uid[:12]} ({name}): {view.note}; adopt it by hand (`orch adopt URL --job {uid[:12]}`)",
            )
            return view
        choice = mk.choose_market(
            losses=losses,
            on_demand_after=self.rc.on_demand_after,
            now=now,
            deadline=_deadline(m),
            remaining=mk.remaining_s(m),
            run_s=float((m.get("cost") or {}).get("run_seconds") or 0.0),
            recovery_s=self.stale_after_s + self.rc.poll_seconds + mk.BOOT_S,
        )
        market = choice.market
        problem = mk.budget_problem(m, self.config.pricing, market)
        if problem and market == mk.ON_DEMAND and mk.budget_problem(m, self.config.pricing, mk.SPOT) is None:
            market, problem = mk.SPOT, None  # on-demand is over budget, spot is not
        if problem:
            view.state, view.note = LEFT, f"not relaunched: {problem}"
            self._event(
                f"{uid}:budget:{cl.lost_identity(own)}",
                EventKind.RELAUNCH_FAILED,
                m,
                f"job {uid[:12]} ({name}) not relaunched: {problem}",
            )
            return view
        view.market = market
        self._launch(uid, m, own, launches + 1, market, choice.why, view)
        view.launches = len(cl.read_claims(self.remote, uid))
        return view

    def _launch(
        self, uid: str, m: dict[str, Any], own: dict[str, Any], n: int, market: str, why: str, view: JobView
    ) -> None:
        now = self.clock()
        claim = cl.Claim(
            uid=uid,
            n=n,
            status=cl.CLAIMED,
            market=market,
            lost={k: own.get(k) for k in ("host", "home_id", "heartbeat")},
            claimed_at=now,
            controller=self.controller_id,
            updated_at=now,
            extra={"controller_host": self.host, "why": why},
        )
        try:
            cl.put_new(self.remote, claim)
        except Conflict:
            view.state, view.note = LAUNCHING, f"launch {n} was claimed by another controller"
            return
        # The lease may have come back (a slow heartbeat) or another machine adopted: look again.
        again = self._read(uid)
        if again is not None:
            fresh = dict(again[0].get("owner") or {})
            age = mf.lease_age(again[0], self.clock())
            if not claim.for_loss(fresh) or (age is not None and age < self.stale_after_s):
                self._cancel(claim, "the lease came back to life before the launch")
                view.state, view.note, view.waiting_since = ALIVE, "lease came back; launch cancelled", None
                return
        name = str(m.get("name") or "")
        request = LaunchRequest(url=self.remote.url.raw, job_uids=(uid,), market=market, launch_number=n)
        started = time.monotonic()
        try:
            what = self.provider.launch(request)
        except RelaunchError as exc:
            error = redact(str(exc))
            claim.status, claim.error, claim.updated_at = cl.FAILED, error, self.clock()
            self._update(claim)
            view.note = f"launch {n} ({market}) failed: {error[:200]}"
            self._event(
                f"{uid}:launch:{n}",
                EventKind.RELAUNCH_FAILED,
                m,
                f"job {uid[:12]} ({name}): launch {n} on {market} failed: {error}",
            )
            return
        took = time.monotonic() - started
        claim.status, claim.launched, claim.updated_at = cl.LAUNCHED, redact(what)[:300], self.clock()
        claim.extra["launch_seconds"] = round(took, 3)
        self._update(claim)
        view.note = f"launch {n} ({market}): {claim.launched}"
        self._event(
            f"{uid}:launch:{n}",
            EventKind.RELAUNCHED,
            m,
            f"job {uid[:12]} ({name}): launch {n} on {market} ({why}): {claim.launched}",
        )

    # -- helpers ------------------------------------------------------------------------------

    def _gone(self, own: dict[str, Any]) -> Optional[bool]:
        try:
            return self.provider.machine_gone(own)
        except OrchError as exc:
            log.warning("provider %s cannot tell whether %s is gone: %s", self.provider.name, own.get("host"), exc)
            return None

    def _cancel(self, claim: cl.Claim, why: str) -> None:
        claim.status, claim.error, claim.updated_at = cl.CANCELLED, why, self.clock()
        self._update(claim)

    def _update(self, claim: cl.Claim) -> None:
        try:
            cl.update(self.remote, claim)
        except Conflict:
            log.warning("launch %d of %s changed under us; left as the other writer wrote it", claim.n, claim.uid)

    def _event(self, key: str, kind: EventKind, m: dict[str, Any], detail: str) -> None:
        payload = {
            "event": kind.value,
            "job_name": str(m.get("name") or ""),
            "state": str(m.get("state") or ""),
            "reason": detail,
            "host": self.host,
        }
        if self.store.recovery_event(key, kind.value, detail, self.clock(), outgoing_for(self.config, kind, payload)):
            self.say(f"{kind.value}: {detail}")


def _deadline(m: dict[str, Any]) -> Optional[float]:
    try:
        return deadline_ts((m.get("spec") or {}).get("deadline"))
    except (TypeError, ValueError):
        return None


def _losses(claims: list[cl.Claim]) -> int:
    """Machines this job has lost: every lapsed lease a launch was claimed for, plus every launched
    machine that never took the job (a later claim for the same lapsed lease)."""
    seen = {cl.lost_identity(c.lost) for c in claims if c.status != cl.CANCELLED}
    never_came = sum(
        1 for i, c in enumerate(claims) if c.status == cl.LAUNCHED and any(d.for_loss(c.lost) for d in claims[i + 1 :])
    )
    return len(seen) + never_came


def _failures_in_row(claims: list[cl.Claim], own: dict[str, Any]) -> int:
    n = 0
    for c in reversed(claims):
        if c.status != cl.FAILED or not c.for_loss(own):
            break
        n += 1
    return n
