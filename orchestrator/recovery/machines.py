"""Which machines the controller launched are still needed, after each pass: the ledger's machines
(ledger.py) set against what the pass saw of their jobs. A machine is stopped (stopping.py) once
  - none of its jobs is unfinished (each finished, and no lease of an unfinished job names it);
  - it held its jobs once and every unfinished one is now held by another machine (a planned
    move settled, or the job was recovered elsewhere while it was cut off);
  - it never took its jobs within `launch_timeout_minutes` (the launch counted lost: a booting
    machine that never adopted is stopped, not left to bill);
  - a planned move's new machine is no longer needed (the decision says so: `not_needed`, next_held.py).
A pass that could not read one of a machine's jobs decides nothing for that machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .ledger import BOOTING, HOLDING, IDLE, STOPPED, STOPPING, UNKNOWN, Ledger, Machine
from .stopping import Stopper


@dataclass
class Seen:
    """One job as this pass saw it."""

    finished: bool
    manifest: dict[str, Any]
    holder_home: str = ""  # the home whose lease is fresh ("" when none)
    holder_instance: str = ""  # the instance id that lease records, if any


class MachineBook:
    def __init__(self, ledger: Ledger, stopper: Stopper, launch_timeout_s: float):
        self.ledger, self.stopper, self.launch_timeout_s = ledger, stopper, launch_timeout_s

    def home_machine(self, home_id: str, instance_id: str = "") -> Optional[Machine]:
        """The ledger's machine a lease names: by the instance id it records, else by its home."""
        m = self.ledger.get(instance_id) if instance_id else None
        return m if m is not None else self.ledger.by_home(home_id)

    def not_needed(self, instance: str, uid: str, why: str, manifest: dict[str, Any]) -> None:
        self.stopper.want(instance, uid, why, manifest)

    def account(self, seen: dict[str, Seen], now: float) -> None:
        """Set each live machine's state from this pass; stop the ones no longer needed."""
        for m in self.ledger.live():
            if m.state == STOPPING:
                continue
            mine = [seen.get(uid) for uid in m.jobs]
            if any(s is None for s in mine):
                continue  # a job unreadable or not listed this pass: decide nothing for it
            jobs = [s for s in mine if s is not None]
            holds = any(s.holder_home and self._names(m, s) for s in seen.values() if not s.finished)
            if holds:
                m.held_at = now
                self.ledger.set_state(m, HOLDING)
            elif all(s.finished for s in jobs):
                self._stop(m, f"its job(s) finished ({_states(jobs)})", jobs)
            elif m.held_at is None:
                if now - m.launched_at > self.launch_timeout_s:
                    self._stop(m, "it did not take its job(s) within launch_timeout_minutes", jobs)
                else:
                    self.ledger.set_state(m, BOOTING)
            elif all(s.finished or (s.holder_home and not self._names(m, s)) for s in jobs):
                self._stop(m, "its job(s) run on another machine now", jobs)
            else:
                self.ledger.set_state(m, UNKNOWN)  # its lease lapsed, or was handed over: not yet settled
            self.ledger.price(m)
        self.stopper.retry_due()

    @staticmethod
    def _names(m: Machine, s: Seen) -> bool:
        return bool((m.home_id and s.holder_home == m.home_id) or (s.holder_instance == m.instance_id))

    def _stop(self, m: Machine, why: str, jobs: list[Seen]) -> None:
        if m.state == STOPPED:
            return
        if not self.stopper.can_stop:
            self.ledger.set_state(m, IDLE)  # no stop command: its own [idle] shutdown powers it off
            return
        manifest = jobs[0].manifest if jobs else {}
        self.stopper.want(m.instance_id, m.jobs[0] if m.jobs else "", why, manifest)


def _states(jobs: list[Seen]) -> str:
    return ", ".join(sorted({str(s.manifest.get("state") or "?") for s in jobs}))
