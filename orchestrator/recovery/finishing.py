"""Finished-machine stops: a finished job's machine, launched by this controller, is stopped once
none of its jobs is left unfinished; a planned move that came too late is refused."""

from __future__ import annotations

from typing import Any

from ..objectstore import claims as cl
from ..objectstore import moves
from . import moving as mv
from .core import ControllerCore


class Finishing(ControllerCore):
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
