"""The held half of next_action.py: a job whose lease is fresh -- the claim that may be open for it
(cancelled: the lease came back; adopted, before or after its launch returned), its holder noted, a
planned move this controller asked settled (the old machine stopped) or considered: does the policy
want it on the other market? The new machine is launched first; only once it is up (the market had
capacity) and booted is the holder asked to hand the job over, so a refused spot launch never leaves
the job without a machine. Pure, as next_action is; plus the helpers both halves read off the claims."""

from __future__ import annotations

from typing import Any, Optional, Protocol

from ..jobs.backoff import backoff_s
from ..model.markets import IDLE, ON_DEMAND, SPOT
from ..model.states import EventKind
from ..objectstore import claims as cl
from . import deciding as dc
from .actions import AdoptedEarly, AskMove, Facts, Gone, NoteHolder, Place, Review, Rules, SettleMove, Stop, WriteClaim
from .jobview import MAX_BACKOFF_S, JobView, claim_instance
from .policy import Decision


class Deciding(Protocol):
    """What this half reads of next_action's evaluation: its claims, clock and rules, the facts it
    asks for, and where its actions go."""

    claims: list[cl.Claim]
    now: float
    rules: Rules
    facts: Facts
    uid: str
    name: str
    move_closed: bool

    def move(self) -> Optional[Any]: ...
    def decide(self, current: str, losses: int) -> Decision: ...
    def gone(self, machine: dict[str, Any]) -> Gone: ...
    def act(self, action: Any) -> None: ...
    def report(self, key: str, kind: EventKind, detail: str) -> None: ...
    def stop_line(self, instance: str) -> str: ...
    def lost_booting(self, claim: cl.Claim) -> None: ...


def launched_machine(claim: cl.Claim) -> dict[str, Any]:
    """What the provider is asked about a machine a launch brought up: its id."""
    return {"instance_id": claim_instance(claim), "home_id": str(claim.extra.get("adopted_by") or "")}


def move_machine(claims: list[cl.Claim], home: str) -> Optional[cl.Claim]:
    """The newest claim for a planned move's new machine, made while `home` held the lease."""
    for c in reversed(claims):
        if c.extra.get("move_for") == home and home:
            return c
    return None


def booting_backoff(claims: list[cl.Claim], claim: cl.Claim, poll_s: float) -> float:
    """When the next launch may follow machines gone while they booted: at once after the first
    (spot reclaimed while booting is the market's doing), then poll x 2^(k-2) after the k-th in a
    row (capped), so a provider that calls every new machine gone costs a launch per backoff, not
    one per poll."""
    k = 0
    for c in reversed(claims):
        if c.status == cl.LAUNCHED and c.extra.get("gone_while_booting"):
            k += 1
        elif c.status == cl.LAUNCHED:
            break
    if k < 2:
        return 0.0
    gone_at = float(claim.extra.get("gone_while_booting") or claim.updated_at)
    return gone_at + backoff_s(k - 2, poll_s, MAX_BACKOFF_S)


def held(d: Deciding, own: dict[str, Any], holder: str, losses: int, view: JobView) -> JobView:
    """A fresh lease: the claim that may be open for it, the planned move settled or considered."""
    latest = d.claims[-1] if d.claims else None
    came_back = latest is not None and latest.lost.get("home_id") == own.get("home_id")
    if latest is not None and latest.extra.get("move_for"):
        pass  # a planned move's new machine, launched while this one holds the lease
    elif latest is not None and latest.status == cl.CLAIMED and came_back:
        # The machine we thought lost heartbeats again (a slow heartbeat, a network blip).
        latest.status, latest.error, latest.updated_at = cl.CANCELLED, "the lease came back to life", d.now
        d.act(WriteClaim(latest, "cancelled"))
    elif latest is not None and latest.status == cl.CLAIMED and latest.n in d.facts.in_flight:
        # The new machine adopted before the launch command returned: the launch's outcome
        # records the machine's id; this only remembers which home it is.
        d.act(AdoptedEarly(latest.n, holder))
    elif latest is not None and latest.status == cl.CLAIMED:
        # Another machine took the job while the claim was open: the launch happened, though the
        # controller that made it died before it could say so.
        latest.status, latest.updated_at = cl.LAUNCHED, d.now
        latest.launched = f"adopted by {own.get('host') or '?'}"
        latest.extra["adopted_by"] = holder
        if own.get("instance_id"):
            latest.extra["instance_id"] = str(own["instance_id"])
        d.act(WriteClaim(latest, "adopted"))
        d.report(
            f"launch:{latest.n}",
            EventKind.RELAUNCHED,
            f"job {d.uid[:12]} ({d.name}): launch {latest.n} on {latest.market} came up: {latest.launched}",
        )
    if holder:
        d.act(NoteHolder(own, d.claims))
    view.note = f"lease held by {own.get('host') or '?'}"
    _settle_move(d, own, view)
    consider_move(d, own, losses, view)
    return view


def _settle_move(d: Deciding, own: dict[str, Any], view: JobView) -> None:
    """A machine holds the job's lease: when that is the new market's machine of a move this
    controller asked, stop the old one, then close the move."""
    move = d.move()
    if move is None or own.get("home_id") == move.from_home:
        return
    state = d.stop_line(move.from_instance) if move.from_instance else "nothing to stop"
    view.note += f"; moved to {move.to}, old machine {move.from_instance or '?'}: {state}"
    close = not d.rules.can_stop or state in ("stopped", "nothing to stop") or "could not" in state
    d.act(SettleMove(move, f"job moved from {move.from_market or '?'} to {move.to}", close, state))
    d.move_closed = close


def consider_move(d: Deciding, own: dict[str, Any], losses: int, view: JobView) -> None:
    """Does the policy want the job on the other market (and what of a move's new machine)?"""
    claims, now = d.claims, d.now
    current = dc.current_market(claims, own)
    view.market = current
    if current not in (SPOT, ON_DEMAND) or d.move() is not None:
        return
    decision = d.decide(current, losses)
    home = str(own.get("home_id") or "")
    coming = move_machine(claims, home)
    if decision.market in (current, IDLE):
        if coming is not None and coming.status == cl.LAUNCHED and claim_instance(coming):
            why = f"the planned move to {coming.market} is no longer wanted ({decision.why})"
            d.act(Stop(claim_instance(coming), why))
        return
    if coming is not None and coming.market == decision.market:
        if coming.status == cl.CLAIMED:
            view.note = f"moving to {decision.market}: launch {coming.n} in progress"
            return
        gone = coming.status == cl.LAUNCHED and (
            bool(coming.extra.get("gone_while_booting")) or d.gone(launched_machine(coming)) is True
        )
        if gone and not coming.extra.get("gone_while_booting"):
            d.lost_booting(coming)
        if gone and now < booting_backoff(claims, coming, d.rules.poll_s):
            view.note = f"moving to {decision.market}: launch {coming.n} was gone while it booted; tries again later"
            return
        if coming.status == cl.LAUNCHED and not gone:
            ready_at = coming.updated_at + d.rules.changeover_s
            if now < ready_at:  # it boots: the old machine works on meanwhile
                d.act(Review(ready_at))
                view.note = f"moving to {decision.market}: launch {coming.n} boots ({coming.launched})"
                return
            # The executor asks; a refusal ("a move already under way", ...) rewrites the note.
            d.act(AskMove(decision.market, decision.why, current))
            view.note = f"moving from {current} to {decision.market} (launch {coming.n} is up): {decision.why}"
            return
    reuse = claims[-1] if claims and claims[-1].status == cl.NO_CAPACITY and claims[-1] is coming else None
    n = reuse.n if reuse is not None else (claims[-1].n + 1 if claims else 1)
    d.act(Place(n, decision.market, decision.why, own, reuse=reuse, move_for=home))
    view.note = f"moving from {current} to {decision.market}: {decision.why}"
