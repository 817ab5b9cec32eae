"""Launch outcomes: this pass's launches claimed (create-only, before the provider is called) and
submitted off the loop through the launcher (bounded by launch_timeout_minutes), one machine per
group; what the provider answered recorded on each claim (launched, no capacity: a free wait, or
failed: logged with its code)."""

from __future__ import annotations

import functools
import logging
import socket
from typing import Any, Callable

from ..model.states import EventKind
from ..objectstore import claims as cl
from ..objectstore import manifest as mf
from ..objectstore import moves
from ..objectstore.remote import Conflict, Remote
from ..redaction import redact
from ..spec.config import Config
from . import market as mk
from . import moving as mv
from .decider import Decider
from .executor import ClaimWriter
from .gathering import Gatherer
from .jobview import (
    ALIVE,
    LAUNCHING,
    WAITING,
    JobView,
    hms,
    timed,
)
from .launcher import InlineLauncher, Launcher, Outcome, error_code
from .ledger import Ledger, Machine
from .placing import Group, Placement, group
from .provider import Launched, LaunchRequest, NoCapacity, Provider, RelaunchError, as_launched
from .reporting import Events
from .stopping import Stopper
from .zones import ZONE_KEY

NO_ID = "a machine with no id: the launch printed nothing, so orch can neither stop it nor ask about it (print instance=<id>)"

log = logging.getLogger("orch.watch")


class Launches:
    def __init__(
        self,
        *,
        config: Config,
        remote: Remote,
        provider: Provider,
        launcher: "Launcher | InlineLauncher",
        clock: Callable[[], float],
        controller_id: str,
        decider: Decider,
        gatherer: Gatherer,
        writer: ClaimWriter,
        events: Events,
        ledger: Ledger,
        stopper: Stopper,
    ):
        assert config.recovery is not None
        self.config, self.remote, self.provider, self.launcher, self.clock = config, remote, provider, launcher, clock
        self.controller_id, self.decider, self.gatherer, self.writer = controller_id, decider, gatherer, writer
        self.events, self.ledger, self.stopper = events, ledger, stopper
        self.host = socket.gethostname()
        self.stale_after_s = config.storage.stale_after_minutes * 60
        self.timeout_s = config.recovery.launch_timeout_minutes * 60  # a launch call's bound
        self.in_flight: dict[str, tuple[float, Group]] = {}  # launcher key -> (since, the group)
        self.placing: list[Placement] = []  # this pass's launches, placed together after it
        self.views: dict[str, JobView] = {}  # this pass's views, for outcomes that land in it
        # Launches whose machine adopted before the launch command returned: (uid, n) -> the home.
        self.adopted_early: dict[tuple[str, int], str] = {}

    def since(self, uid: str) -> dict[int, float]:
        """Job `uid`'s launches whose provider call runs: launch n -> since when."""
        out: dict[int, float] = {}
        for since, g in self.in_flight.values():
            for p in g.placements:
                if p.uid == uid:
                    out.setdefault(p.n, since)
        return out

    def place(self) -> None:
        """Claim this pass's launches, then launch each group (the jobs of one lost machine, one
        market) on one machine, off the loop."""
        zones = self.decider.zones
        for g in group(self.placing):
            zone = zones.choose(g.market, self.clock(), self.decider.retry_s, g.gpus) if zones else None
            if zones is not None and zone is None:
                continue  # spot in no zone now (refused since the decision): the next pass decides again
            for p in g.placements:
                p.zone = zone.name if zone else ""
            g.placements = [p for p in g.placements if self._claim(p)]
            if not g.placements:
                continue
            first = g.placements[0]
            request = LaunchRequest(
                url=self.remote.url.raw,
                job_uids=g.uids,
                market=g.market,
                launch_number=first.n,
                gpus=g.gpus,
                zone=zone.name if zone else "",
                price=zone.price(g.market) if zone else None,
                signing_key_env=self.config.storage.signing_key_env or "",
            )
            key = g.key()
            self.in_flight[key] = (self.clock(), g)
            for p in g.placements:
                p.view.state, p.view.note = (
                    LAUNCHING,
                    f"launch {p.n} ({g.market}{' in ' + request.zone if request.zone else ''}) in progress since "
                    f"{hms(self.clock())}",
                )
            self.launcher.submit(key, timed(functools.partial(self.provider.launch, request)), timeout_s=self.timeout_s)
        self.placing.clear()  # (the executor holds this list: cleared, not replaced)

    def _claim(self, p: Placement) -> bool:
        """Claim launch p.n (create-only; a capacity wait's claim is claimed again, conditional on
        its ETag), then look at the lease again. False: not this controller's to launch."""
        now = self.clock()
        lost = {k: p.owner.get(k) for k in ("host", "home_id", "heartbeat")}
        extra: dict[str, Any] = {"controller_host": self.host, "why": p.why}
        if p.move_for:
            extra["move_for"] = p.move_for
        if p.zone:
            extra[ZONE_KEY] = p.zone
        try:
            if p.reuse is not None:
                claim = p.reuse
                claim.status, claim.market, claim.claimed_at, claim.updated_at = cl.CLAIMED, p.market, now, now
                claim.controller, claim.error = self.controller_id, ""
                claim.extra.update(extra)
                cl.update(self.remote, claim)
            else:
                claim = cl.Claim(p.uid, p.n, cl.CLAIMED, p.market, lost, now, self.controller_id, now, extra=extra)
                cl.put_new(self.remote, claim)
        except Conflict:
            p.view.state, p.view.note = LAUNCHING, f"launch {p.n} was claimed by another controller"
            return False
        # The lease may have come back (a slow heartbeat) or another machine adopted: look again.
        again = None if p.move_for else self.gatherer.manifest(p.uid)
        if again is not None:
            fresh = dict(again[0].get("owner") or {})
            age = mf.lease_age(again[0], self.clock())
            alive = age is not None and age < self.stale_after_s and not fresh.get("released")
            if not claim.for_loss(fresh) or alive:
                self.writer.cancel(claim, "the lease came back to life before the launch")
                p.view.state, p.view.note, p.view.waiting_since = ALIVE, "lease came back; launch cancelled", None
                return False
        p.claim = claim
        return True

    def collect(self) -> None:
        """Record the provider calls that finished since the last look (alive answers are kept
        for the pass that asked: gathering.Gatherer.gone)."""
        for outcome in self.gatherer.take_later():
            if self.stopper.outcome(outcome):
                continue
            flight = self.in_flight.pop(outcome.key, None)
            if flight is not None:
                self._launched(flight[1], outcome)

    def _record_machine(self, g: Group, launched: Launched, now: float) -> None:
        """The ledger's record of the machine a launch brought up (once per group)."""
        first = g.placements[0]
        assert first.claim is not None
        early = self.adopted_early.get((first.uid, first.n), "")
        zones = self.decider.zones
        zone = zones.named(first.zone) if zones is not None and first.zone else None
        zone_price = zone.price(g.market) if zone is not None else None  # the zone's own, where the config says
        self.ledger.add(
            Machine(
                launched.instance_id,
                g.market,
                list(g.uids),
                now,
                zone=first.zone or None,
                launch=f"{first.uid}:{first.n}",
                move_for=first.move_for,
                home_id=early,
                price_hour=zone_price or mk.hourly_price(self.config.pricing, g.market, g.gpus),
                text=redact(launched.text)[:300],
            )
        )

    def _write_launched(self, claim: cl.Claim, launched: Launched, took: Any, now: float) -> None:
        """Mark the claim launched with the machine's id -- also when the machine adopted first and
        the claim was changed meanwhile (by this controller's pass or the last one's): the id is
        merged into what is there, never lost and never replaced by "adopted"."""
        early = self.adopted_early.pop((claim.uid, claim.n), "")
        for _ in range(3):
            if claim.status in (cl.CLAIMED, cl.LAUNCHED):
                if claim.status == cl.CLAIMED or not claim.launched or claim.launched.startswith("adopted by "):
                    claim.launched = redact(launched.text or launched.instance_id)[:300]
                claim.status, claim.updated_at = cl.LAUNCHED, now
            claim.extra["instance_id"] = launched.instance_id
            claim.extra["launch_seconds"] = took
            if early:
                claim.extra.setdefault("adopted_by", early)
            if self.writer.update(claim, retrying=True):
                return
            fresh = [c for c in cl.read_claims(self.remote, claim.uid) if c.n == claim.n]
            if not fresh:
                break
            claim.status, claim.launched, claim.etag = fresh[0].status, fresh[0].launched, fresh[0].etag
            claim.extra = {**fresh[0].extra, **{k: v for k, v in claim.extra.items() if k not in fresh[0].extra}}
        log.warning(
            "launch %d of %s: could not record machine %s in its claim", claim.n, claim.uid, launched.instance_id
        )

    def _launched(self, g: Group, outcome: Outcome) -> None:
        error = outcome.error
        if error is not None:  # a refusal for capacity is the market's answer, not the provider failing
            log.log(
                logging.INFO if isinstance(error, NoCapacity) else logging.WARNING,
                "provider %s: %s failed (%s): %s",
                self.provider.name,
                outcome.key[:120],
                error_code(error),
                redact(str(error))[:300],
            )
        took, launched = None, Launched("")
        if error is None:
            took, what = outcome.value
            launched = as_launched(what)
            if launched.instance_id:
                self._record_machine(g, launched, self.clock())
            else:
                launched = Launched("", NO_ID)
        together = f" (with {len(g.placements) - 1} more job(s) of the same machine)" if len(g.placements) > 1 else ""
        for p in g.placements:
            claim, m, n, uid = p.claim, p.manifest, p.n, p.uid
            assert claim is not None
            name = str(m.get("name") or "")
            view = self.views.get(uid, p.view)
            now = self.clock()
            if isinstance(error, NoCapacity):
                text = redact(str(error))
                claim.status, claim.error, claim.updated_at = cl.NO_CAPACITY, text, now
                claim.extra["capacity_tries"] = int(claim.extra.get("capacity_tries") or 0) + 1
                claim.extra.setdefault("capacity_since", now)
                self.writer.update(claim)
                view.state, view.note = WAITING, f"no {g.market} capacity (launch {n} waits, free): {text[:200]}"
                self.events.report(
                    f"{uid}:capacity:{n}",
                    EventKind.CAPACITY_WAIT,
                    m,
                    f"job {uid[:12]} ({name}): no {g.market} capacity; the job waits (free, not a launch): {text}",
                )
            elif error is not None:
                text = redact(str(error) if isinstance(error, RelaunchError) else f"provider: {error}")
                claim.status, claim.error, claim.updated_at = cl.FAILED, text, now
                self.writer.update(claim)
                view.state, view.note = WAITING, f"launch {n} ({g.market}) failed: {text[:200]}"
                self.events.report(
                    f"{uid}:launch:{n}",
                    EventKind.RELAUNCH_FAILED,
                    m,
                    f"job {uid[:12]} ({name}): launch {n} on {g.market} failed: {text}",
                )
            else:
                if len(g.placements) > 1:
                    claim.extra["together"] = list(g.uids)
                self._write_launched(claim, launched, took, now)
                if p.move is not None:
                    mv.mark(self.remote, p.move, moves.LAUNCHED, f"launch {n}: {claim.launched}", now)
                view.state, view.note = WAITING, f"launch {n} ({g.market}): {claim.launched}"
                self.events.report(
                    f"{uid}:launch:{n}",
                    EventKind.RELAUNCHED,
                    m,
                    f"job {uid[:12]} ({name}): launch {n} on {g.market} ({p.why}){together}: {claim.launched}",
                )
            view.launches = cl.launches(cl.read_claims(self.remote, uid))
