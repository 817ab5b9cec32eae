"""The per-job pass: the facts the decision (next_action.py) needs gathered, its actions performed
-- claim writes, events, the ledger's notes, planned moves, stops -- and its launches placed
(outcomes.py claims and makes them after the pass)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..objectstore import claims as cl
from ..objectstore import moves
from ..objectstore.signing import content_id
from . import actions as ac
from . import moving as mv
from .finishing import Finishing
from .jobview import UNFINISHED, JobView, claim_instance
from .next_action import next_action
from .placing import Placement

MAX_QUESTIONS = 12  # facts one decision may ask for (each asked once: the decision is finite)


class JobPass(Finishing):
    def _job(self, uid: str) -> Optional[JobView]:
        read = self._read(uid)
        if read is None:
            return None
        m, _ = read
        raw = self._parsed[uid][0]
        problem = self.gate.problem(uid, raw)  # the verify gate: nothing below sees an untrusted manifest
        facts = ac.Facts(uid, self._rules(), untrusted=problem, content_id=content_id(raw) if problem else "")
        claims: list[cl.Claim] = []
        if problem is None and m.get("state") in UNFINISHED:
            claims = cl.read_claims(self.remote, uid, self._claims)
            self._enter_launches(claims)
            self.market.note_claims(uid, claims)
            flying: dict[int, float] = {}
            for since, g in self._in_flight.values():
                for p in g.placements:
                    if p.uid == uid:
                        flying.setdefault(p.n, since)
            facts = dataclasses.replace(facts, in_flight=flying)
        now = self.clock()
        for _ in range(MAX_QUESTIONS):
            plan = next_action(m, claims, facts, now)
            if plan.need is None:
                break
            facts = self._answer(m, facts, plan.need)
        else:
            raise AssertionError(f"job {uid}: the decision kept asking ({plan.need})")
        assert plan.view is not None
        self._execute(uid, m, plan, plan.view)
        return plan.view

    def _rules(self) -> ac.Rules:
        return ac.Rules(
            stale_after_s=self.stale_after_s,
            launch_timeout_s=self.launch_timeout_s,
            capacity_retry_s=self.capacity_retry_s,
            poll_s=self.rc.poll_seconds,
            max_launches=self.rc.max_launches,
            changeover_s=self.rc.changeover_minutes * 60,
            provider=self.provider.name,
            pricing=self.config.pricing,
            zoned=self.zones is not None,
            can_stop=self.stopper.can_stop,
        )

    def _answer(self, m: dict[str, Any], facts: ac.Facts, need: ac.Need) -> ac.Facts:
        """The one fact the decision asked for, gathered: a provider's answer (off the loop, asked
        once per pass), the policy's, the planned move under way, what a stop would say."""
        if isinstance(need, ac.NeedGone):
            gone = {**facts.gone, ac.machine_key(need.machine): self._gone(dict(need.machine))}
            return dataclasses.replace(facts, gone=gone)
        if isinstance(need, ac.NeedDecision):
            decision = self._decide(m, list(need.claims), need.current, need.losses)
            return dataclasses.replace(facts, decisions={**facts.decisions, (need.current, need.losses): decision})
        if isinstance(need, ac.NeedMove):
            return dataclasses.replace(facts, move_read=True, move=mv.under_way(self.store, self.remote, facts.uid))
        stops = {**facts.stops, need.instance: self.stopper.state_once_wanted(need.instance)}
        return dataclasses.replace(facts, stops=stops)

    def _execute(self, uid: str, m: dict[str, Any], plan: ac.Plan, view: JobView) -> None:
        """Perform the decision's actions, in order."""
        if plan.seen is not None:
            self._seen[uid] = plan.seen
        for a in plan.actions:
            if isinstance(a, ac.WriteClaim):
                self._update(a.claim)
            elif isinstance(a, ac.AdoptedEarly):
                self._adopted_early[(uid, a.n)] = a.home
            elif isinstance(a, ac.Report):
                self._event(a.key, a.kind, m, a.detail)
            elif isinstance(a, ac.NoteHolder):
                self._note_holder(uid, a.owner, a.claims)
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
                self._placing.append(
                    Placement(
                        uid, m, a.owner, a.n, a.market, a.why, view, reuse=a.reuse, move=a.move, move_for=a.move_for
                    )
                )
            elif isinstance(a, ac.SettleFinished):
                self._settle_finished(uid, m)
            elif isinstance(a, ac.Review):
                self._review(a.at)

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
