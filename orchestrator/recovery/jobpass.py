"""The per-job pass: what the controller does for one job in the mirror each pass -- leave it, say it
is alive, note a loss, wait for capacity, move it to the other market, or place a launch (which
outcomes.py claims and makes after the pass)."""

from __future__ import annotations

from typing import Any, Optional

from ..jobs.backoff import backoff_s
from ..model.markets import IDLE, ON_DEMAND, SPOT
from ..model.states import EventKind
from ..objectstore import claims as cl
from ..objectstore import manifest as mf
from ..objectstore import moves
from . import deciding as dc
from . import market as mk
from . import moving as mv
from .core import ASKING
from .finishing import Finishing
from .jobview import (
    ALIVE,
    DONE,
    LAUNCHING,
    LEFT,
    MAX_BACKOFF_S,
    RELEASED,
    UNFINISHED,
    WAITING,
    JobView,
    count_losses,
    failures_in_row,
    claim_instance,
    hms,
    wasted_launches,
)
from .machines import Seen
from .placing import Placement
from .policy import Decision


class JobPass(Finishing):
    def _job(self, uid: str) -> Optional[JobView]:
        read = self._read(uid)
        if read is None:
            return None
        m, _ = read
        distrusted = self._distrust(uid, m)  # the verify gate: nothing below sees an untrusted manifest
        if distrusted is not None:
            return distrusted
        name = str(m.get("name") or "")
        if m.get("state") not in UNFINISHED:
            self._settle_finished(uid, m)
            self._seen[uid] = Seen(True, m)
            return JobView(uid, name, DONE, str(m.get("state")))
        own = dict(m.get("owner") or {})
        claims = cl.read_claims(self.remote, uid, self._claims)
        self._enter_launches(claims)
        self.market.note_claims(uid, claims)
        launches = cl.launches(claims)
        losses = count_losses(claims)
        view = JobView(uid, name, ALIVE, launches=launches, losses=losses)
        move: Optional[moves.MoveRequest] = None
        if own.get("released"):
            move = mv.handed_over(self.store, self.remote, uid, own)  # a planned move: launch on `to`
            if move is None:
                view.state, view.note = RELEASED, "its lease was released by a clean stop; not relaunched"
                return view
        now = self.clock()
        age = mf.lease_age(m, now)
        fresh = age is not None and age < self.stale_after_s and not own.get("released")
        holder = str(own.get("home_id") or "") if fresh else ""
        self._seen[uid] = Seen(False, m, holder, str(own.get("instance_id") or "") if fresh else "")
        latest = claims[-1] if claims else None
        reuse: Optional[cl.Claim] = None
        if move is None and age is not None and age < self.stale_after_s:
            came_back = latest is not None and latest.lost.get("home_id") == own.get("home_id")
            if latest is not None and latest.extra.get("move_for"):
                pass  # a planned move's new machine, launched while this one holds the lease
            elif latest is not None and latest.status == cl.CLAIMED and came_back:
                # The machine we thought lost heartbeats again (a slow heartbeat, a network blip).
                self._cancel(latest, "the lease came back to life")
            elif latest is not None and latest.status == cl.CLAIMED and self._since(uid, latest.n) is not None:
                # The new machine adopted before the launch command returned: the launch's outcome
                # records the machine's id; this only remembers which home it is.
                self._adopted_early[(uid, latest.n)] = holder
            elif latest is not None and latest.status == cl.CLAIMED:
                # Another machine took the job while the claim was open: the launch happened,
                # though the controller that made it died before it could say so.
                latest.status, latest.updated_at = cl.LAUNCHED, now
                latest.launched = f"adopted by {own.get('host') or '?'}"
                latest.extra["adopted_by"] = holder
                if own.get("instance_id"):
                    latest.extra["instance_id"] = str(own["instance_id"])
                self._update(latest)
                self._event(
                    f"{uid}:launch:{latest.n}",
                    EventKind.RELAUNCHED,
                    m,
                    f"job {uid[:12]} ({name}): launch {latest.n} on {latest.market} came up: {latest.launched}",
                )
            if holder:
                self._note_holder(uid, own, claims)
            view.note = f"lease held by {own.get('host') or '?'}"
            self._settle_move(uid, m, own, view)
            self._consider_move(uid, m, own, claims, losses, view)
            return view
        # The lease has lapsed (or there never was one).
        # (Whether the manifest may be acted on at all was decided above, by the gate: a lease here
        # was signed by a machine holding the bucket key, or the job is `orch launch`'s from here.)
        never_leased = not own.get("home_id") and own.get("heartbeat") is None
        lost_at = float(own.get("heartbeat") or m.get("written_at") or now)
        view.state, view.waiting_since = WAITING, lost_at
        if move is not None:
            coming = self._move_machine(claims, move.from_home)
            if coming is not None and coming.status == cl.LAUNCHED and coming.market == move.to:
                if move.status == moves.ASKED:
                    mv.mark(self.remote, move, moves.LAUNCHED, f"launch {coming.n}: {coming.launched}", now)
                if (
                    now - coming.updated_at < self.launch_timeout_s
                    and self._gone(self._launched_machine(coming)) is not True
                ):
                    view.market = coming.market
                    view.note = f"handed over for a move to {move.to}; launch {coming.n} takes it: {coming.launched}"
                    return view
        if latest is not None and latest.for_loss(own) and latest.status != cl.CANCELLED:
            since = self._since(uid, latest.n)
            if latest.status == cl.CLAIMED and since is not None:
                view.state, view.market = LAUNCHING, latest.market
                view.note = f"launch {latest.n} ({latest.market}) in progress since {hms(since)}"
                return view
            if latest.status == cl.NO_CAPACITY:
                due = latest.updated_at + self.capacity_retry_s
                if latest.market == ON_DEMAND:  # nowhere else to go: refusals back off, not every poll
                    tries = int(latest.extra.get("capacity_tries") or 1)
                    due = latest.updated_at + backoff_s(tries - 1, self.capacity_retry_s, MAX_BACKOFF_S)
                view.market = latest.market
                waiting = self._decide(m, claims, IDLE, losses)  # another market or zone goes at once
                if now < due and waiting.market in (IDLE, latest.market) and not self._elsewhere(latest, waiting):
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
            if (
                booting
                and not latest.extra.get("gone_while_booting")
                and self._gone(self._launched_machine(latest)) is True
            ):
                # A machine gone while it boots (spot reclaimed) is lost now, not at the launch
                # timeout; on spot that is the market's doing, not a failed launch.
                self._lost_booting(uid, latest, m, now)
            if booting and latest.extra.get("gone_while_booting"):
                booting = False
                due = self._booting_backoff(claims, latest)
                if now < due:  # never a launch per poll when every new machine is "gone"
                    view.note = f"launch {latest.n} was gone while it booted; next try in {due - now:.0f} s"
                    return view
            if booting:
                view.market = latest.market
                view.note = f"launch {latest.n} ({latest.market}) is coming up: {latest.launched}"
                return view
            if latest.status == cl.FAILED:
                failed_in_row = failures_in_row(claims, own)
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
            if gone is False or gone == ASKING:
                view.state = ALIVE
                view.note = (
                    f"lease silent {age or 0:.0f} s, but the {self.provider.name} provider says the machine is up"
                    if gone is False
                    else f"lease silent {age or 0:.0f} s; asking the {self.provider.name} provider whether it still runs"
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
        wasted = wasted_launches(claims)
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

    def _consider_move(
        self, uid: str, m: dict[str, Any], own: dict[str, Any], claims: list[cl.Claim], losses: int, view: JobView
    ) -> None:
        """A job on a machine this controller launched: does the policy want it on the other market?"""
        current = dc.current_market(claims, own)
        view.market = current
        if current not in (SPOT, ON_DEMAND) or mv.under_way(self.store, self.remote, uid) is not None:
            return
        decision = self._decide(m, claims, current, losses)
        home = str(own.get("home_id") or "")
        if decision.market in (current, IDLE):
            unwanted = self._move_machine(claims, home)
            if unwanted is not None and unwanted.status == cl.LAUNCHED and claim_instance(unwanted):
                why = f"the planned move to {unwanted.market} is no longer wanted ({decision.why})"
                self.book.not_needed(claim_instance(unwanted), uid, why, m)
            return
        # The new machine first: only once it is launched (the market had capacity) is the holder
        # asked to hand the job over, so a refused spot launch never leaves the job without one.
        coming = self._move_machine(claims, home)
        if coming is not None and coming.market == decision.market:
            if coming.status == cl.CLAIMED:
                view.note = f"moving to {decision.market}: launch {coming.n} in progress"
                return
            gone = coming.status == cl.LAUNCHED and (
                bool(coming.extra.get("gone_while_booting")) or self._gone(self._launched_machine(coming)) is True
            )
            if gone and not coming.extra.get("gone_while_booting"):
                self._lost_booting(uid, coming, m, self.clock())
            if gone and self.clock() < self._booting_backoff(claims, coming):
                view.note = (
                    f"moving to {decision.market}: launch {coming.n} was gone while it booted; tries again later"
                )
                return
            if coming.status == cl.LAUNCHED and not gone:
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

    def _lost_booting(self, uid: str, claim: cl.Claim, m: dict[str, Any], now: float) -> None:
        """The provider says a machine that never took its job is gone: noted on its claim, and
        stopped (if the answer was wrong, it would otherwise bill until launch_timeout)."""
        claim.extra["gone_while_booting"] = now
        self._update(claim)
        instance = claim_instance(claim)
        if instance:
            self.book.not_needed(instance, uid, "the provider says it was gone while it booted", m)

    def _booting_backoff(self, claims: list[cl.Claim], claim: cl.Claim) -> float:
        """When the next launch may follow machines gone while they booted: at once after the first
        (spot reclaimed while booting is the market's doing), then poll x 2^(k-2) after the k-th in
        a row (capped), so a provider that calls every new machine gone costs a launch per
        backoff, not one per poll."""
        k = 0
        for c in reversed(claims):
            if c.status == cl.LAUNCHED and c.extra.get("gone_while_booting"):
                k += 1
            elif c.status == cl.LAUNCHED:
                break
        if k < 2:
            return 0.0  # one spot machine reclaimed while it booted is the market: launch again at once
        gone_at = float(claim.extra.get("gone_while_booting") or claim.updated_at)
        return gone_at + backoff_s(k - 2, self.rc.poll_seconds, MAX_BACKOFF_S)

    def _launched_machine(self, claim: cl.Claim) -> dict[str, Any]:
        """What the provider is asked about a machine a launch brought up: its id."""
        return {"instance_id": claim_instance(claim), "home_id": str(claim.extra.get("adopted_by") or "")}

    def _note_holder(self, uid: str, own: dict[str, Any], claims: list[cl.Claim]) -> None:
        """A fresh lease names home H: when H is the machine one of this job's launches brought up,
        the ledger and the claim learn it (so `alive` and the stops can find the machine by its home)."""
        home, instance = str(own.get("home_id") or ""), str(own.get("instance_id") or "")
        if self.book.home_machine(home, instance) is not None:
            machine = self.book.home_machine(home, instance)
            if machine is not None and not machine.home_id:
                machine.home_id = home
                self.ledger.touch(machine)
            return
        for c in reversed(claims):
            if c.status != cl.LAUNCHED or c.extra.get("adopted_by"):
                continue
            if home in (c.lost.get("home_id"), c.extra.get("move_for")):
                continue  # the machine it was launched to replace, or the holder a move takes it from
            machine = self.ledger.get(claim_instance(c))
            if machine is None or machine.home_id:
                continue
            machine.home_id = home
            self.ledger.touch(machine)
            c.extra["adopted_by"] = home
            self._update(c)
            return

    def _move_machine(self, claims: list[cl.Claim], home: str) -> Optional[cl.Claim]:
        """The newest claim for a planned move's new machine, made while `home` held the lease."""
        for c in reversed(claims):
            if c.extra.get("move_for") == home and home:
                return c
        return None

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
