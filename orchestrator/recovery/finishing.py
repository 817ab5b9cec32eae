"""A finished job: a planned move asked for it that came too late is closed as refused. Its
machines are stopped by the ledger's accounting (machines.py), once none of their jobs is left.
Also: the launches this controller made that its ledger does not hold yet (made by an orch from
before the ledger) are entered in it, so they are stopped like the others."""

from __future__ import annotations

from typing import Any

from ..objectstore import claims as cl
from ..objectstore import moves
from . import moving as mv
from .core import ControllerCore
from .jobview import claim_instance
from .ledger import STOPPED, Machine


class Finishing(ControllerCore):
    def _settle_finished(self, uid: str, m: dict[str, Any]) -> None:
        """Once per finished job (per controller process): refuse a move that came too late."""
        if uid in self._settled:
            return
        self._settled.add(uid)
        self._enter_launches(cl.read_claims(self.remote, uid, self._claims))
        move = mv.under_way(self.store, self.remote, uid)
        if move is not None and move.status == moves.ASKED:
            mv.mark(self.remote, move, moves.REFUSED, f"the job was {m.get('state')} first", self.clock())

    def _enter_launches(self, claims: list[cl.Claim]) -> None:
        """This controller's launched claims whose machine the ledger does not know: entered."""
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
