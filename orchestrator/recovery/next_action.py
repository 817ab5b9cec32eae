"""What `orch watch` does for one job this pass, decided without touching anything: from the job's
manifest, its launch claims and the facts the controller gathered (actions.Facts), the actions in
order and the view they leave (actions.Plan) -- leave it (its lease is fresh, or the provider says
its machine is up), note a loss, wait (capacity, a backoff), move it to the other market, place a
launch (claimed and made after the pass: outcomes.py), or leave it alone for good. A fact not
gathered yet is asked for (`Plan.need`) and the decision is made again with it.

The claims are this call's own copies: an action that changes one (a cancel, an adoption, a
machine gone while it booted) carries the changed copy, and what follows in the decision sees the
change, as the executor will write it."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

from ..jobs.backoff import backoff_s
from ..model.errors import OrchError
from ..model.markets import IDLE, ON_DEMAND, SPOT
from ..model.states import EventKind
from ..objectstore import claims as cl
from ..objectstore import manifest as mf
from ..objectstore import moves
from . import market as mk
from . import zones as zn
from .actions import (
    ASKING,
    Facts,
    Gone,
    LeaveAlone,
    MarkMove,
    NeedDecision,
    NeedGone,
    NeedMove,
    NeedStop,
    Place,
    Plan,
    Report,
    Review,
    SettleFinished,
    Stop,
    Wait,
    WriteClaim,
    machine_key,
)
from .jobview import (
    ALIVE,
    DONE,
    LAUNCHING,
    LEFT,
    MAX_BACKOFF_S,
    RELEASED,
    UNFINISHED,
    UNTRUSTED,
    WAITING,
    JobView,
    claim_instance,
    count_losses,
    deadline_of,
    failures_in_row,
    hms,
    wasted_launches,
)
from .machines import Seen
from .next_held import booting_backoff, held, launched_machine, move_machine
from .policy import Decision


class _Missing(OrchError):
    """Not an error: the decision stops where it needs a fact it was not given (`need`), and the
    controller gathers that fact and asks again. An OrchError as everything orch raises on purpose."""

    def __init__(self, need: Any):
        super().__init__(f"the decision needs {need!r} first")
        self.need = need


def next_action(manifest: dict[str, Any], claims: list[cl.Claim], facts: Facts, now: float) -> Plan:
    """The plan for one job now (see the module's doc)."""
    plan = Plan()
    try:
        plan.view = Deciding(manifest, claims, facts, now, plan).job()
    except _Missing as missing:
        return Plan(need=missing.need)
    return plan


class Deciding:
    """One evaluation: the facts, the plan being built, the questions it raises."""

    def __init__(self, m: dict[str, Any], claims: list[cl.Claim], facts: Facts, now: float, plan: Plan):
        self.m, self.facts, self.rules, self.now, self.plan = m, facts, facts.rules, now, plan
        self.claims = [dataclasses.replace(c, lost=dict(c.lost), extra=dict(c.extra)) for c in claims]
        self.uid, self.name = facts.uid, str(m.get("name") or "")
        self.move_closed = False  # this pass's settle closes the move under way

    # -- facts ---------------------------------------------------------------------------------

    def gone(self, machine: dict[str, Any]) -> Gone:
        key = machine_key(machine)
        if key not in self.facts.gone:
            raise _Missing(NeedGone(machine))
        return self.facts.gone[key]

    def decide(self, current: str, losses: int) -> Decision:
        got = self.facts.decisions.get((current, losses))
        if got is None:
            raise _Missing(NeedDecision(current, losses, tuple(self.claims)))
        if got.review_at is not None:
            self.plan.actions.append(Review(got.review_at))
        if got.infeasible_at is not None:
            self._infeasible(got.infeasible_at)
        return got

    def move(self) -> Optional[moves.MoveRequest]:
        if not self.facts.move_read:
            raise _Missing(NeedMove())
        return None if self.move_closed else self.facts.move

    def stop_line(self, instance: str) -> str:
        if instance not in self.facts.stops:
            raise _Missing(NeedStop(instance))
        return self.facts.stops[instance]

    def act(self, action: Any) -> None:
        self.plan.actions.append(action)

    def report(self, key: str, kind: EventKind, detail: str) -> None:
        self.act(Report(f"{self.uid}:{key}", kind, detail))

    # -- the job -------------------------------------------------------------------------------

    def job(self) -> JobView:
        m, uid, name = self.m, self.uid, self.name
        if self.facts.untrusted is not None:  # the verify gate: nothing below sees an untrusted manifest
            problem = self.facts.untrusted
            if m.get("state") in UNFINISHED:
                self.report(
                    f"untrusted:{self.facts.content_id}",
                    EventKind.UNTRUSTED,
                    f"job {uid[:12]} ({name}): not launched: its manifest in the bucket is not trusted: {problem}",
                )
            return JobView(uid, name, UNTRUSTED, f"not launched: its manifest is not trusted: {problem}")
        if m.get("state") not in UNFINISHED:
            self.act(SettleFinished(str(m.get("state"))))
            self.plan.seen = Seen(True, m)
            return JobView(uid, name, DONE, str(m.get("state")))
        own = dict(m.get("owner") or {})
        claims = self.claims
        losses = count_losses(claims)
        view = JobView(uid, name, ALIVE, launches=cl.launches(claims), losses=losses)
        move: Optional[moves.MoveRequest] = None
        if own.get("released"):
            under = self.move()  # a planned move this controller asked: launch on `to`
            move = under if under is not None and under.from_home == own.get("home_id") else None
            if move is None:
                view.state, view.note = RELEASED, "its lease was released by a clean stop; not relaunched"
                return view
        now = self.now
        age = mf.lease_age(m, now)
        fresh = age is not None and age < self.rules.stale_after_s and not own.get("released")
        holder = str(own.get("home_id") or "") if fresh else ""
        self.plan.seen = Seen(False, m, holder, str(own.get("instance_id") or "") if fresh else "")
        if move is None and age is not None and age < self.rules.stale_after_s:
            return held(self, own, holder, losses, view)
        return self._lapsed(own, age, move, losses, view)

    def lost_booting(self, claim: cl.Claim) -> None:
        """The provider says a machine that never took its job is gone: noted on its claim, and
        stopped (if the answer was wrong, it would otherwise bill until launch_timeout)."""
        claim.extra["gone_while_booting"] = self.now
        self.act(WriteClaim(claim, "gone while booting"))
        instance = claim_instance(claim)
        if instance:
            self.act(Stop(instance, "the provider says it was gone while it booted"))

    def _lapsed(
        self, own: dict[str, Any], age: Optional[float], move: Optional[moves.MoveRequest], losses: int, view: JobView
    ) -> JobView:
        """The lease has lapsed (or there never was one, or it was handed over for a move)."""
        now, rules, claims, uid, name = self.now, self.rules, self.claims, self.uid, self.name
        latest = claims[-1] if claims else None
        reuse: Optional[cl.Claim] = None
        never_leased = not own.get("home_id") and own.get("heartbeat") is None
        view.state, view.waiting_since = WAITING, float(own.get("heartbeat") or self.m.get("written_at") or now)
        if move is not None:
            coming = move_machine(claims, move.from_home)
            if coming is not None and coming.status == cl.LAUNCHED and coming.market == move.to:
                if move.status == moves.ASKED:
                    self.act(MarkMove(move, moves.LAUNCHED, f"launch {coming.n}: {coming.launched}"))
                if now - coming.updated_at < rules.launch_timeout_s and self.gone(launched_machine(coming)) is not True:
                    view.market = coming.market
                    view.note = f"handed over for a move to {move.to}; launch {coming.n} takes it: {coming.launched}"
                    return view
        if latest is not None and latest.for_loss(own) and latest.status != cl.CANCELLED:
            since = self.facts.in_flight.get(latest.n)
            if latest.status == cl.CLAIMED and since is not None:
                view.state, view.market = LAUNCHING, latest.market
                view.note = f"launch {latest.n} ({latest.market}) in progress since {hms(since)}"
                return view
            if latest.status == cl.NO_CAPACITY:
                due = latest.updated_at + rules.capacity_retry_s
                if latest.market == ON_DEMAND:  # nowhere else to go: refusals back off, not every poll
                    tries = int(latest.extra.get("capacity_tries") or 1)
                    due = latest.updated_at + backoff_s(tries - 1, rules.capacity_retry_s, MAX_BACKOFF_S)
                view.market = latest.market
                waiting = self.decide(IDLE, losses)  # another market or zone goes at once
                elsewhere = rules.zoned and waiting.market in (SPOT, ON_DEMAND) and waiting.zone != zn.zone_of(latest)
                if now < due and waiting.market in (IDLE, latest.market) and not elsewhere:
                    view.note = (
                        f"no {latest.market} capacity (launch {latest.n} waits, free); next try in {due - now:.0f} s"
                    )
                    self.act(Wait(view.note, due))
                    return view
                reuse = latest
            if latest.status == cl.CLAIMED and now - latest.claimed_at < rules.launch_timeout_s:
                view.state, view.market = LAUNCHING, latest.market
                view.note = f"launch {latest.n} claimed by {latest.controller[:12]} (in progress)"
                return view
            booting = latest.status == cl.LAUNCHED and now - latest.updated_at < rules.launch_timeout_s
            if booting and not latest.extra.get("gone_while_booting") and self.gone(launched_machine(latest)) is True:
                # A machine gone while it boots (spot reclaimed) is lost now, not at the launch
                # timeout; on spot that is the market's doing, not a failed launch.
                self.lost_booting(latest)
            if booting and latest.extra.get("gone_while_booting"):
                booting = False
                due = booting_backoff(claims, latest, rules.poll_s)
                if now < due:  # never a launch per poll when every new machine is "gone"
                    view.note = f"launch {latest.n} was gone while it booted; next try in {due - now:.0f} s"
                    self.act(Wait(view.note, due))
                    return view
            if booting:
                view.market = latest.market
                view.note = f"launch {latest.n} ({latest.market}) is coming up: {latest.launched}"
                return view
            if latest.status == cl.FAILED:
                due = latest.updated_at + backoff_s(failures_in_row(claims, own) - 1, rules.poll_s, MAX_BACKOFF_S)
                if now < due:
                    view.note = f"launch {latest.n} failed; next try in {due - now:.0f} s: {latest.error[:200]}"
                    self.act(Wait(view.note, due))
                    return view
            if latest.status == cl.LAUNCHED:  # it never took the job: that machine is lost too
                losses += 1
                view.losses = losses
        elif move is None and not never_leased:
            # A new loss: ask the provider, then say so once.
            gone = self.gone(own)
            if gone is False or gone == ASKING:
                view.state = ALIVE
                view.note = (
                    f"lease silent {age or 0:.0f} s, but the {rules.provider} provider says the machine is up"
                    if gone is False
                    else f"lease silent {age or 0:.0f} s; asking the {rules.provider} provider whether it still runs"
                )
                return view
            losses += 1
            view.losses = losses
            self.report(
                f"lost:{cl.lost_identity(own)}",
                EventKind.MACHINE_LOST,
                f"job {uid[:12]} ({name}): the lease of host {own.get('host') or '?'} has been silent "
                f"{age or 0:.0f} s (stale after {rules.stale_after_s:.0f} s)",
            )
        wasted = wasted_launches(claims)
        if wasted >= rules.max_launches:
            view.state = LEFT
            view.note = (
                f"{wasted} launch(es) that never brought the job back, max_launches = {rules.max_launches}: left alone"
            )
            self.report(
                "max",
                EventKind.RELAUNCH_FAILED,
                f"job {uid[:12]} ({name}): {view.note}; adopt it by hand (`orch adopt URL --job {uid[:12]}`)",
            )
            self.act(LeaveAlone(view.note))
            return view
        # A handed-over job goes where the policy says now: the move's market, unless it can no
        # longer be had (spot refused meanwhile) -- then idle or on-demand, as for any job.
        choice = self.decide(IDLE, losses)
        if move is not None and choice.market == move.to:
            choice = Decision(move.to, f"planned move from {move.from_market or '?'} to {move.to}: {move.why}")
        if choice.market == IDLE:
            view.note = choice.why
            return view
        market = choice.market
        problem = mk.budget_problem(self.m, rules.pricing, market)
        if problem and market == mk.ON_DEMAND and mk.budget_problem(self.m, rules.pricing, mk.SPOT) is None:
            market, problem = mk.SPOT, None  # on-demand is over budget, spot is not
        if problem:
            view.state, view.note = LEFT, f"not relaunched: {problem}"
            self.report(
                f"budget:{cl.lost_identity(own)}",
                EventKind.RELAUNCH_FAILED,
                f"job {uid[:12]} ({name}) not relaunched: {problem}",
            )
            self.act(LeaveAlone(view.note))
            return view
        view.market = market
        n = reuse.n if reuse is not None else (claims[-1].n + 1 if claims else 1)
        self.act(Place(n, market, choice.why, own, reuse=reuse, move=move))
        return view

    def _infeasible(self, earliest: float) -> None:
        """Say once per job that its deadline cannot be met, with the earliest finish orch can promise."""
        deadline = deadline_of(self.m)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(earliest))
        late = f"{(earliest - deadline) / 3600:.1f} h after its deadline" if deadline is not None else ""
        self.report(
            "infeasible",
            EventKind.DEADLINE_INFEASIBLE,
            f"job {self.uid[:12]} ({self.name}) cannot meet its deadline even on on-demand: "
            f"the earliest finish is {when}, {late}; it runs on on-demand to finish as soon as it can",
        )
