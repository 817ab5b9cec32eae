"""The actions next_action.py decides, performed: claim writes (conditional on their ETag), events,
the machine ledger's notes, stops, planned moves asked, marked and settled, launches placed for
after the pass (outcomes.py), a finished job settled once. Nothing here decides."""

from __future__ import annotations

from typing import Any, Callable

from ..objectstore import claims as cl
from ..objectstore import moves
from ..objectstore.remote import Conflict, Remote
from . import actions as ac
from . import moving as mv
from .jobview import JobView, claim_instance
from .ledger import STOPPED, Ledger, Machine
from .machines import MachineBook, Seen
from .placing import Placement
from .reporting import Events
from .stopping import Stopper


class ClaimWriter:
    def __init__(self, remote: Remote, clock: Callable[[], float], say: Callable[[str], None]):
        self.remote, self.clock, self.say = remote, clock, say

    def update(self, claim: cl.Claim, *, retrying: bool = False) -> bool:
        """Write the claim, conditional on its ETag; False when another writer changed it first (said
        in words unless the caller re-reads and tries again)."""
        try:
            cl.update(self.remote, claim)
            return True
        except Conflict:
            if retrying:
                return False
            self.say(
                f"job {claim.uid[:12]}: launch {claim.n}'s record in the bucket was rewritten by someone else "
                "since this controller read it (another `orch watch` on this bucket, or the same one "
                "restarted); it is left as they wrote it"
            )
            return False

    def cancel(self, claim: cl.Claim, why: str) -> None:
        claim.status, claim.error, claim.updated_at = cl.CANCELLED, why, self.clock()
        self.update(claim)


class Executor:
    def __init__(
        self,
        *,
        remote: Remote,
        store: Any,
        clock: Callable[[], float],
        controller_id: str,
        writer: ClaimWriter,
        events: Events,
        ledger: Ledger,
        book: MachineBook,
        stopper: Stopper,
        read_claims: Callable[[str], list[cl.Claim]],
        ask_move: Callable[[str, str, str], Any],
        review: Callable[[float], None],
        placing: list[Placement],
        adopted_early: dict[tuple[str, int], str],
    ):
        self.remote, self.store, self.clock, self.controller_id = remote, store, clock, controller_id
        self.writer, self.events, self.ledger, self.book, self.stopper = writer, events, ledger, book, stopper
        self.read_claims, self.ask_move, self.review = read_claims, ask_move, review
        self.placing, self.adopted_early = placing, adopted_early  # outcomes.py's, shared
        self.seen: dict[str, Seen] = {}  # this pass: uid -> what it saw of the job (machines.py)
        self._settled: set[str] = set()  # finished jobs this process has looked at once

    def run(self, uid: str, m: dict[str, Any], plan: ac.Plan, view: JobView) -> None:
        """Perform the decision's actions, in order."""
        if plan.seen is not None:
            self.seen[uid] = plan.seen
        for a in plan.actions:
            if isinstance(a, ac.WriteClaim):
                self.writer.update(a.claim)
            elif isinstance(a, ac.AdoptedEarly):
                self.adopted_early[(uid, a.n)] = a.home
            elif isinstance(a, ac.Report):
                self.events.report(a.key, a.kind, m, a.detail)
            elif isinstance(a, ac.NoteHolder):
                self.note_holder(a.owner, a.claims)
            elif isinstance(a, ac.SettleMove):
                self.stopper.want(a.move.from_instance, uid, a.why, m)
                if a.close:
                    mv.mark(self.remote, a.move, moves.DONE, a.state, self.clock())
            elif isinstance(a, ac.MarkMove):
                mv.mark(self.remote, a.move, a.status, a.note, self.clock())
            elif isinstance(a, ac.Stop):
                self.book.not_needed(a.instance, uid, a.why, m)
            elif isinstance(a, ac.AskMove):
                try:
                    self.ask_move(uid, a.to, a.why)
                except mv.MoveRefused as exc:
                    view.note = f"would move from {a.current} to {a.to} ({a.why}), but {exc}"
            elif isinstance(a, ac.Place):
                p = Placement(
                    uid, m, a.owner, a.n, a.market, a.why, view, reuse=a.reuse, move=a.move, move_for=a.move_for
                )
                self.placing.append(p)
            elif isinstance(a, ac.SettleFinished):
                self.settle_finished(uid, m)
            elif isinstance(a, ac.Review):
                self.review(a.at)

    def note_holder(self, own: dict[str, Any], claims: list[cl.Claim]) -> None:
        """A fresh lease names home H: when H is the machine one of this job's launches brought up,
        the ledger and the claim learn it (so `alive` and the stops can find the machine by its home)."""
        home, instance = str(own.get("home_id") or ""), str(own.get("instance_id") or "")
        machine = self.book.home_machine(home, instance)
        if machine is not None:
            if not machine.home_id:
                machine.home_id = home
                self.ledger.touch(machine)
            return
        for c in reversed(claims):
            if c.status != cl.LAUNCHED or c.extra.get("adopted_by"):
                continue
            if home in (c.lost.get("home_id"), c.extra.get("move_for")):
                continue  # the machine it was launched to replace, or the holder a move takes it from
            launched = self.ledger.get(claim_instance(c))
            if launched is None or launched.home_id:
                continue
            launched.home_id = home
            self.ledger.touch(launched)
            c.extra["adopted_by"] = home
            self.writer.update(c)
            return

    def settle_finished(self, uid: str, m: dict[str, Any]) -> None:
        """Once per finished job (per controller process): its launches entered in the ledger (so
        its machines are stopped: machines.py), a planned move that came too late refused."""
        if uid in self._settled:
            return
        self._settled.add(uid)
        self.enter_launches(self.read_claims(uid))
        move = mv.under_way(self.store, self.remote, uid)
        if move is not None and move.status == moves.ASKED:
            mv.mark(self.remote, move, moves.REFUSED, f"the job was {m.get('state')} first", self.clock())

    def enter_launches(self, claims: list[cl.Claim]) -> None:
        """This controller's launched claims whose machine the ledger does not know (made by an orch
        from before the ledger): entered, so they are stopped like the others."""
        for c in claims:
            instance = claim_instance(c) if c.status == cl.LAUNCHED and c.controller == self.controller_id else ""
            if not instance or self.ledger.get(instance) is not None:
                continue
            jobs = [str(u) for u in c.extra.get("together") or [c.uid]]
            machine = Machine(instance, c.market, jobs, c.updated_at, launch=f"{c.uid}:{c.n}")
            machine.move_for, machine.home_id = str(c.extra.get("move_for") or ""), str(c.extra.get("adopted_by") or "")
            if self.store.recovery_marked(f"stopped:{instance}"):  # stopped by an orch from before the ledger
                machine.state = STOPPED
            self.ledger.add(machine)
