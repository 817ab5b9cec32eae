"""`orch watch`: one pass over the mirror's jobs, and the loop that repeats it.

For each unfinished job whose owner lease has been silent longer than [storage]
stale_after_minutes and was not released, the controller
  1. asks the provider whether the old machine is gone (False: leave it; None/True: go on),
  2. queues `machine_lost` (once per lapsed lease),
  3. refuses past `max_launches` or what `max_cost` can pay for (one `relaunch_failed`),
  4. chooses the market (market.py),
  5. claims launch n in the mirror, create-only (claims.py), BEFORE calling the provider,
  6. reads the manifest again: a lease that came back to life cancels the claim,
  7. calls the provider off the loop (launcher.py), the jobs one lost machine held together on one
     machine (placing.py): `relaunched`; `capacity_wait` when the market has no capacity (the job
     waits, free; the claim is reused, not counted toward max_launches); or `relaunch_failed` and
     a backoff before the next claim.
A claim that did not lead to an adoption within `launch_timeout_minutes` (the controller died
mid-launch, or the machine never came up) is followed by the next claim. The controller never runs a job."""

from __future__ import annotations

import functools
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

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
from . import deciding as dc
from .policy import Decision, decide
from ..model.markets import IDLE, ON_DEMAND, SPOT
from . import moving as mv
from ..objectstore import moves
from .launcher import InlineLauncher, Launcher, Outcome
from .stopping import Stopper
from .placing import Group, Placement, group
from .provider import LaunchRequest, NoCapacity, Provider, RelaunchError

log = logging.getLogger("orch.watch")

UNFINISHED = ("queued", "running")  # a stopped job stays stopped: the user stopped it
MAX_BACKOFF_S = 1800.0

# What a job is doing, as `orch watch` and `orch status` in the controller's home say it.
UNTRUSTED = "not trusted"  # a job in the bucket no machine ever held, not put there by `orch launch` here
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
        launcher: "Launcher | InlineLauncher | None" = None,
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
        # Provider calls run here; by default at once (tests, the benchmark's simulated clock).
        self.launcher = launcher or InlineLauncher()
        self.capacity_retry_s = self.rc.poll_seconds  # a capacity wait's next try: the next poll
        self._in_flight: dict[str, tuple[float, Group]] = {}  # launcher key -> (since, the group)
        self._placing: list[Placement] = []  # this pass's launches, placed together after it
        self._views: dict[str, JobView] = {}  # this pass's views, for outcomes that land in it
        # The market policy (policy.decide; the market benchmark passes its baselines here), what
        # this controller has seen of the spot market across its jobs, and the earliest moment a
        # decision of the last pass changes by itself (a simulated clock jumps there).
        self.policy: Callable[..., Decision] = decide
        self.market = dc.MarketView()
        self.next_review: Optional[float] = None
        self._claims: dict[str, Any] = {}  # uid -> the claims as last listed and read (claims.read_claims)
        self._parsed: dict[str, tuple[bytes, dict[str, Any]]] = {}  # uid -> its manifest as last read
        self.reaction_s = self.stale_after_s + self.rc.poll_seconds
        self.stopper = Stopper(provider, self.launcher, store, clock, self._event, self.rc.poll_seconds, redact, say)
        self._homes: dict[str, str] = {}  # this pass: uid -> the home holding an unfinished job's lease
        self._finished: dict[str, tuple[str, list[str], dict[str, Any]]] = {}  # uid -> (machine, its jobs, m)
        self._settled: set[str] = set()  # finished jobs this process has looked at once
        self._machines: dict[str, tuple[str, list[str], dict[str, Any]]] = {}
        self._watched: set[str] = set()  # jobs this process has seen unfinished

    # -- one pass -----------------------------------------------------------------------------

    def pass_once(self) -> list[JobView]:
        """Look at every job in the mirror once; launch where a lease lapsed. Raises StorageError
        when the mirror cannot be listed (the loop retries at the next poll)."""
        views = []
        self._collect()
        self._placing, self._views, self._homes, self._finished = [], {}, {}, {}
        self.next_review = None
        for uid in sorted(self.remote.list_dirs("jobs")):
            try:
                view = self._job(uid)
            except StorageError as exc:  # one job's objects unreadable now: the others still go
                view = JobView(uid, "", UNREADABLE, f"cannot read the mirror: {exc}")
            if view is None:
                continue
            views.append(view)
            self._views[uid] = view
        self._place()
        self._stop_finished_machines()
        self._collect()
        for view in views:
            uid = view.uid
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
        held = self._parsed.get(uid)
        if held is not None and held[0] == got[0]:
            return held[1], got[1]  # unchanged since the last pass: checked then
        try:
            m = parse_manifest(got[0], self.remote.where(key), uid)
        except ManifestError:
            return None
        self._parsed[uid] = (got[0], m)
        return m, got[1]

    def _job(self, uid: str) -> Optional[JobView]:
        read = self._read(uid)
        if read is None:
            return None
        m, _ = read
        name = str(m.get("name") or "")
        if m.get("state") not in UNFINISHED:
            self._settle_finished(uid, m)
            return JobView(uid, name, DONE, str(m.get("state")))
        own = dict(m.get("owner") or {})
        self._watched.add(uid)
        if own.get("home_id") and not own.get("released"):
            self._homes[uid] = str(own["home_id"])
        claims = cl.read_claims(self.remote, uid, self._claims)
        self.market.note_claims(uid, claims)
        launches = cl.launches(claims)
        losses = _losses(claims)
        view = JobView(uid, name, ALIVE, launches=launches, losses=losses)
        move: Optional[moves.MoveRequest] = None
        if own.get("released"):
            move = mv.handed_over(self.store, self.remote, uid, own)  # a planned move: launch on `to`
            if move is None:
                view.state, view.note = RELEASED, "its lease was released by a clean stop; not relaunched"
                return view
        now = self.clock()
        age = mf.lease_age(m, now)
        latest = claims[-1] if claims else None
        reuse: Optional[cl.Claim] = None
        if move is None and age is not None and age < self.stale_after_s:
            came_back = latest is not None and latest.lost.get("home_id") == own.get("home_id")
            if latest is not None and latest.extra.get("move_for"):
                pass  # a planned move's new machine, launched while this one holds the lease
            elif latest is not None and latest.status == cl.CLAIMED and came_back:
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
            self._settle_move(uid, m, own, view)
            self._consider_move(uid, m, own, claims, losses, view)
            return view
        # The lease has lapsed (or there never was one).
        never_leased = not own.get("home_id") and own.get("heartbeat") is None
        if never_leased and not self.store.recovery_marked(launch_key(uid)):
            # The bucket is untrusted: a job no machine ever held is launched (paid) only when
            # `orch launch` in this home put it there. Anything else is reported, never launched.
            view.state = UNTRUSTED
            view.note = "never held by a machine and not put in the bucket by `orch launch` here: not launched"
            self._event(f"{uid}:untrusted", EventKind.RELAUNCH_FAILED, m, f"job {uid[:12]} ({name}): {view.note}")
            return view
        lost_at = float(own.get("heartbeat") or m.get("written_at") or now)
        view.state, view.waiting_since = WAITING, lost_at
        if move is not None:
            coming = self._move_machine(claims, move.from_home)
            if coming is not None and coming.status == cl.LAUNCHED and coming.market == move.to:
                if move.status == moves.ASKED:
                    mv.mark(self.remote, move, moves.LAUNCHED, f"launch {coming.n}: {coming.launched}", now)
                if now - coming.updated_at < self.launch_timeout_s and self._gone(_instance(coming)) is not True:
                    view.market = coming.market
                    view.note = f"handed over for a move to {move.to}; launch {coming.n} takes it: {coming.launched}"
                    return view
        if latest is not None and latest.for_loss(own) and latest.status != cl.CANCELLED:
            since = self._since(uid, latest.n)
            if latest.status == cl.CLAIMED and since is not None:
                view.state, view.market = LAUNCHING, latest.market
                view.note = f"launch {latest.n} ({latest.market}) in progress since {_hms(since)}"
                return view
            if latest.status == cl.NO_CAPACITY:
                due = latest.updated_at + self.capacity_retry_s
                view.market = latest.market
                waiting = self._decide(m, claims, IDLE, losses)
                if now < due and waiting.market != ON_DEMAND:
                    view.note = (
                        f"no {latest.market} capacity (launch {latest.n} waits, free); next try in {due - now:.0f} s"
                    )
                    return view
                reuse = latest
            if latest.status == cl.CLAIMED and now - latest.claimed_at < self.launch_timeout_s:
                view.state, view.market = LAUNCHING, latest.market
                view.note = f"launch {latest.n} claimed by {latest.controller[:12]} (in progress)"
                return view
            booting = latest.status == cl.LAUNCHED and now - latest.updated_at < self.launch_timeout_s
            if booting and self._gone(_instance(latest)) is True:
                # A machine gone while it boots (spot reclaimed) is lost now, not at the launch
                # timeout; on spot that is the market's doing, not a failed launch.
                latest.extra["gone_while_booting"] = now
                self._update(latest)
                booting = False
            if booting:
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
        elif move is None and not never_leased:
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
        wasted = _wasted_launches(claims)
        if wasted >= self.rc.max_launches:
            view.state = LEFT
            view.note = f"{wasted} launch(es) that never brought the job back, max_launches = {self.rc.max_launches}: left alone"
            self._event(
                f"{uid}:max",
                EventKind.RELAUNCH_FAILED,
                m,
                f"job {uid[:12]} ({name}): {view.note}; adopt it by hand (`orch adopt URL --job {uid[:12]}`)",
            )
            return view
        # A handed-over job goes where the policy says now: the move's market, unless it can no
        # longer be had (spot refused meanwhile) -- then idle or on-demand, as for any job.
        choice = self._decide(m, claims, IDLE, losses)
        if move is not None and choice.market == move.to:
            choice = Decision(move.to, f"planned move from {move.from_market or '?'} to {move.to}: {move.why}")
        if choice.market == IDLE:
            view.note = choice.why
            return view
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
        n = reuse.n if reuse is not None else (claims[-1].n + 1 if claims else 1)
        self._placing.append(Placement(uid, m, own, n, market, choice.why, view, reuse=reuse, move=move))
        return view

    # -- the market ---------------------------------------------------------------------------

    def _decide(self, m: dict[str, Any], claims: list[cl.Claim], current: str, losses: int) -> Decision:
        """The policy's answer for this job now (and when it would change by itself)."""
        now = self.clock()
        started = float(m.get("submitted_at") or m.get("started_at") or m.get("written_at") or now)
        situation = dc.situation(
            m,
            now=now,
            started=started,
            deadline=_deadline(m),
            current=current,
            losses=losses,
            market=self.market,
            rc=self.rc,
            pricing=self.config.pricing,
            reaction_s=self.reaction_s,
            retry_s=self.capacity_retry_s,
        )
        decision = self.policy(situation)
        self._review(decision.review_at)
        if situation.deadline is None and _deadline(m) is not None:
            decision = Decision(decision.market, decision.why + " (no pace measured yet)", decision.review_at)
        return decision

    def _review(self, at: Optional[float]) -> None:
        if at is not None and (self.next_review is None or at < self.next_review):
            self.next_review = at

    def _consider_move(
        self, uid: str, m: dict[str, Any], own: dict[str, Any], claims: list[cl.Claim], losses: int, view: JobView
    ) -> None:
        """A job on a machine this controller launched: does the policy want it on the other market?"""
        current = dc.current_market(claims, own)
        view.market = current
        if current not in (SPOT, ON_DEMAND) or mv.under_way(self.store, self.remote, uid) is not None:
            return
        decision = self._decide(m, claims, current, losses)
        if decision.market in (current, IDLE):
            return
        # The new machine first: only once it is launched (the market had capacity) is the holder
        # asked to hand the job over, so a refused spot launch never leaves the job without one.
        home = str(own.get("home_id") or "")
        coming = self._move_machine(claims, home)
        if coming is not None and coming.market == decision.market:
            if coming.status == cl.CLAIMED:
                view.note = f"moving to {decision.market}: launch {coming.n} in progress"
                return
            if coming.status == cl.LAUNCHED and self._gone(_instance(coming)) is not True:
                ready_at = coming.updated_at + self.rc.changeover_minutes * 60
                if self.clock() < ready_at:  # it boots: the old machine works on meanwhile
                    self._review(ready_at)
                    view.note = f"moving to {decision.market}: launch {coming.n} boots ({coming.launched})"
                    return
                try:
                    self.ask_move(uid, decision.market, decision.why)
                except mv.MoveRefused as exc:
                    view.note = f"would move from {current} to {decision.market} ({decision.why}), but {exc}"
                    return
                view.note = f"moving from {current} to {decision.market} (launch {coming.n} is up): {decision.why}"
                return
        reuse = claims[-1] if claims and claims[-1].status == cl.NO_CAPACITY and claims[-1] is coming else None
        n = reuse.n if reuse is not None else (claims[-1].n + 1 if claims else 1)
        self._placing.append(Placement(uid, m, own, n, decision.market, decision.why, view, reuse=reuse, move_for=home))
        view.note = f"moving from {current} to {decision.market}: {decision.why}"

    def _move_machine(self, claims: list[cl.Claim], home: str) -> Optional[cl.Claim]:
        """The newest claim for a planned move's new machine, made while `home` held the lease."""
        for c in reversed(claims):
            if c.extra.get("move_for") == home and home:
                return c
        return None

    # -- launching ----------------------------------------------------------------------------

    def _place(self) -> None:
        """Claim this pass's launches, then launch each group (the jobs of one lost machine, one
        market) on one machine, off the loop."""
        for g in group(self._placing):
            g.placements = [p for p in g.placements if self._claim(p)]
            if not g.placements:
                continue
            first = g.placements[0]
            request = LaunchRequest(
                url=self.remote.url.raw, job_uids=g.uids, market=g.market, launch_number=first.n, gpus=g.gpus
            )
            key = g.key()
            self._in_flight[key] = (self.clock(), g)
            for p in g.placements:
                p.view.state, p.view.note = (
                    LAUNCHING,
                    f"launch {p.n} ({g.market}) in progress since {_hms(self.clock())}",
                )
            self.launcher.submit(key, _timed(functools.partial(self.provider.launch, request)))
        self._placing = []

    def _claim(self, p: Placement) -> bool:
        """Claim launch p.n (create-only; a capacity wait's claim is claimed again, conditional on
        its ETag), then look at the lease again. False: not this controller's to launch."""
        now = self.clock()
        lost = {k: p.owner.get(k) for k in ("host", "home_id", "heartbeat")}
        extra: dict[str, Any] = {"controller_host": self.host, "why": p.why}
        if p.move_for:
            extra["move_for"] = p.move_for
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
        again = None if p.move_for else self._read(p.uid)
        if again is not None:
            fresh = dict(again[0].get("owner") or {})
            age = mf.lease_age(again[0], self.clock())
            alive = age is not None and age < self.stale_after_s and not fresh.get("released")
            if not claim.for_loss(fresh) or alive:
                self._cancel(claim, "the lease came back to life before the launch")
                p.view.state, p.view.note, p.view.waiting_since = ALIVE, "lease came back; launch cancelled", None
                return False
        p.claim = claim
        return True

    def in_flight(self) -> int:
        """Provider calls running now."""
        return len(self._in_flight)

    def _since(self, uid: str, n: int) -> Optional[float]:
        """When this controller's launch n of `uid` started, while the provider call runs."""
        for since, g in self._in_flight.values():
            if any(p.uid == uid and p.n == n for p in g.placements):
                return since
        return None

    def _collect(self) -> None:
        """Record the provider calls that finished since the last look."""
        for outcome in self.launcher.finished():
            if self.stopper.outcome(outcome):
                continue
            flight = self._in_flight.pop(outcome.key, None)
            if flight is not None:
                self._launched(flight[1], outcome)

    def _launched(self, g: Group, outcome: Outcome) -> None:
        error = outcome.error
        took = None
        if error is None:
            took, what = outcome.value
        together = f" (with {len(g.placements) - 1} more job(s) of the same machine)" if len(g.placements) > 1 else ""
        for p in g.placements:
            claim, m, n, uid = p.claim, p.manifest, p.n, p.uid
            assert claim is not None
            name = str(m.get("name") or "")
            view = self._views.get(uid, p.view)
            now = self.clock()
            if isinstance(error, NoCapacity):
                text = redact(str(error))
                claim.status, claim.error, claim.updated_at = cl.NO_CAPACITY, text, now
                claim.extra["capacity_tries"] = int(claim.extra.get("capacity_tries") or 0) + 1
                claim.extra.setdefault("capacity_since", now)
                self._update(claim)
                view.state, view.note = WAITING, f"no {g.market} capacity (launch {n} waits, free): {text[:200]}"
                self._event(
                    f"{uid}:capacity:{n}",
                    EventKind.CAPACITY_WAIT,
                    m,
                    f"job {uid[:12]} ({name}): no {g.market} capacity; the job waits (free, not a launch): {text}",
                )
            elif error is not None:
                text = redact(str(error) if isinstance(error, RelaunchError) else f"provider: {error}")
                claim.status, claim.error, claim.updated_at = cl.FAILED, text, now
                self._update(claim)
                view.state, view.note = WAITING, f"launch {n} ({g.market}) failed: {text[:200]}"
                self._event(
                    f"{uid}:launch:{n}",
                    EventKind.RELAUNCH_FAILED,
                    m,
                    f"job {uid[:12]} ({name}): launch {n} on {g.market} failed: {text}",
                )
            else:
                claim.status, claim.launched, claim.updated_at = cl.LAUNCHED, redact(what)[:300], now
                claim.extra["launch_seconds"] = took
                if len(g.placements) > 1:
                    claim.extra["together"] = list(g.uids)
                self._update(claim)
                if p.move is not None:
                    mv.mark(self.remote, p.move, moves.LAUNCHED, f"launch {n}: {claim.launched}", now)
                view.state, view.note = WAITING, f"launch {n} ({g.market}): {claim.launched}"
                self._event(
                    f"{uid}:launch:{n}",
                    EventKind.RELAUNCHED,
                    m,
                    f"job {uid[:12]} ({name}): launch {n} on {g.market} ({p.why}){together}: {claim.launched}",
                )
            view.launches = cl.launches(cl.read_claims(self.remote, uid))

    # -- planned moves and stops --------------------------------------------------------------

    def ask_move(self, uid: str, to: str, why: str) -> moves.MoveRequest:
        """Ask, through the bucket, that the lease holder hand job `uid` over for market `to`
        (moving.py). Raises moving.MoveRefused (a finished job, no holder, a move under way)."""
        return mv.ask(self.store, self.remote, self.config, uid, to, why, by=self.controller_id, now=self.clock())

    def _settle_move(self, uid: str, m: dict[str, Any], own: dict[str, Any], view: JobView) -> None:
        """A machine holds the job's lease: when that is the new market's machine of a move this
        controller asked, stop the old one, then close the move."""
        move = mv.under_way(self.store, self.remote, uid)
        if move is None or own.get("home_id") == move.from_home:
            return
        why = f"job moved from {move.from_market or '?'} to {move.to}"
        self.stopper.want(move.from_instance, uid, why, m)
        state = self.stopper.state(move.from_instance) if move.from_instance else "nothing to stop"
        view.note += f"; moved to {move.to}, old machine {move.from_instance or '?'}: {state}"
        if not self.stopper.can_stop or state in ("stopped", "nothing to stop") or "could not" in (state or ""):
            mv.mark(self.remote, move, moves.DONE, state or "", self.clock())

    def _settle_finished(self, uid: str, m: dict[str, Any]) -> None:
        """Once per finished job (per controller process): refuse a move that came too late, and
        note the machine that ran it, to be stopped when none of its jobs is left unfinished."""
        if uid in self._settled:
            if uid in self._machines:
                self._finished[uid] = self._machines[uid]
            return
        self._settled.add(uid)
        move = mv.under_way(self.store, self.remote, uid)
        if move is not None and move.status == moves.ASKED:
            mv.mark(self.remote, move, moves.REFUSED, f"the job was {m.get('state')} first", self.clock())
        if uid not in self._watched:
            return  # finished before this process saw it run: its machine is not this process's to stop
        launched = [c for c in cl.read_claims(self.remote, uid) if c.status == cl.LAUNCHED and c.launched]
        # The machine that ran it: the one its lease names, else the newest launch that was not a
        # planned move's new machine; such a machine that never took the job over is stopped too.
        own = m.get("owner") or {}
        instance, home = str(own.get("instance_id") or ""), str(own.get("home_id") or "")
        unused = [c for c in launched if home and c.extra.get("move_for") == home]  # it never left `home`
        ran = [c for c in launched if instance and c.launched.split()[0] == instance]
        ran = ran or [c for c in launched if c not in unused] or launched
        for c in unused:
            if c is not ran[-1]:
                self.stopper.want(c.launched.split()[0], uid, "the job finished before it moved there", m)
        if launched:
            last = ran[-1]
            together = [str(u) for u in last.extra.get("together") or [uid]]
            self._machines[uid] = (last.launched.split()[0], together, m)
            self._finished[uid] = self._machines[uid]

    def _stop_finished_machines(self) -> None:
        """A machine this controller launched whose jobs have all finished is stopped (its daemon
        also powers it off with [idle] shutdown; this is for machines that do not)."""
        busy = set(self._homes.values())
        for uid, (instance, together, m) in self._finished.items():
            if self.stopper.stopped(instance) or any(u in self._homes for u in together):
                continue
            holder = str((m.get("owner") or {}).get("home_id") or "")
            if holder and holder in busy:
                continue  # the machine still holds another unfinished job's lease
            self.stopper.want(instance, uid, f"its job(s) finished ({m.get('state')})", m)

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


def launch_key(uid: str) -> str:
    """The controller's record that `orch launch` in its home put job `uid` in the bucket."""
    return f"launch:{uid}"


def _timed(call: Callable[[], str]) -> Callable[[], tuple[float, str]]:
    def run() -> tuple[float, str]:
        started = time.monotonic()
        what = call()
        return round(time.monotonic() - started, 3), what

    return run


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _deadline(m: dict[str, Any]) -> Optional[float]:
    try:
        return deadline_ts((m.get("spec") or {}).get("deadline"))
    except (TypeError, ValueError):
        return None


def _losses(claims: list[cl.Claim]) -> int:
    """Machines this job has lost: every lapsed lease a launch was claimed for, plus every launched
    machine that never took the job (a later claim for the same lapsed lease)."""
    seen = {cl.lost_identity(c.lost) for c in claims if c.status != cl.CANCELLED and not c.extra.get("move_for")}
    return len(seen) + sum(1 for _ in _never_came(claims))


def _never_came(claims: list[cl.Claim]) -> Iterator[cl.Claim]:
    """Launched machines that never took the job: a later claim is for the same lapsed lease."""
    later: set[tuple[str, Any]] = set()
    for c in reversed(claims):
        identity = cl.lost_identity(c.lost)
        if c.status == cl.LAUNCHED and identity in later:
            yield c
        later.add(identity)


def _instance(claim: cl.Claim) -> dict[str, Any]:
    """What the provider can ask the cloud about a launched machine: its instance id."""
    return {"instance_id": claim.launched.split(" ")[0] if claim.launched else ""}


def _wasted_launches(claims: list[cl.Claim]) -> int:
    """Launches that did not bring the job back: failed ones, and launched machines that never
    took the job. A machine that ran the job and was reclaimed later (spot) or handed it over (a
    planned move) did its work: it does not count toward max_launches, nor does a capacity wait."""
    failed = sum(1 for c in claims if c.status == cl.FAILED)
    reclaimed = sum(1 for c in _never_came(claims) if c.market == SPOT and c.extra.get("gone_while_booting"))
    return failed + sum(1 for _ in _never_came(claims)) - reclaimed


def _failures_in_row(claims: list[cl.Claim], own: dict[str, Any]) -> int:
    n = 0
    for c in reversed(claims):
        if c.status != cl.FAILED or not c.for_loss(own):
            break
        n += 1
    return n
