"""Stopping machines orch no longer needs (machines.py decides which): the provider's `stop` runs
off the loop (launcher.py). A stop that fails is tried again with backoff (poll x 2^n, capped at
half an hour), notified once (`stop_failed`), shown in the ledger (`orch status --url`: stopping,
try n, the last error) and never dropped: a machine left running bills. A machine stopped is
recorded in the ledger, in the controller's store, so a restarted controller does not stop it
twice, and one it was stopping is stopped by the next controller of the same home."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional

from ..jobs.backoff import backoff_s
from ..model.states import EventKind
from .launcher import Outcome, error_code
from .ledger import STOPPED, STOPPING, Ledger, Machine

MAX_BACKOFF_S = 1800.0
log = logging.getLogger("orch.watch")
PREFIX = "stop:"
SAY_HAND_AFTER = 5  # failed tries before the note says "stop it by hand" (the tries go on)
NO_STOP = "no [recovery] stop: left to its own [idle] shutdown"


class Stopper:
    def __init__(
        self,
        provider: Any,
        launcher: Any,
        ledger: Ledger,
        clock: Callable[[], float],
        event: Callable[[str, EventKind, dict[str, Any], str], None],
        poll_s: float,
        redact: Callable[[str], str],
        say: Callable[[str], None],
        *,
        timeout_s: Optional[float] = None,  # a stop call's bound (None: the launcher's own)
    ):
        self.provider, self.launcher, self.ledger, self.clock = provider, launcher, ledger, clock
        self.timeout_s = timeout_s
        self.event, self.poll_s, self.redact, self.say = event, poll_s, redact, say
        self._next_at: dict[str, float] = {}  # instance -> when its next try is due
        self._manifests: dict[str, dict[str, Any]] = {}  # instance -> a manifest of one of its jobs
        self._asked: set[str] = set()  # stops submitted whose outcome is not recorded yet

    def stopped(self, instance: str) -> bool:
        m = self.ledger.get(instance)
        return m is not None and m.state == STOPPED

    @property
    def can_stop(self) -> bool:
        return bool(getattr(self.provider, "can_stop", True))

    def state(self, instance: str) -> Optional[str]:
        """A line for the job's note while the stop is under way, or None."""
        if not self.can_stop:
            return NO_STOP
        m = self.ledger.get(instance)
        if m is None or m.state not in (STOPPING, STOPPED):
            return None
        return _line(m)

    def state_once_wanted(self, instance: str) -> str:
        """What state() will say once want(instance) is called (the decision reads it before the
        executor calls want: next_action.py)."""
        if not self.can_stop:
            return NO_STOP
        m = self.ledger.get(instance)
        return _line(m) if m is not None else _line(Machine(instance, "", [], 0.0, state=STOPPING))

    def want(self, instance: str, uid: str, why: str, manifest: dict[str, Any], market: str = "") -> None:
        """Stop `instance` (with retries until it is stopped) unless it was stopped already. A
        machine not in the ledger (one a lease names, started by hand) is added to it."""
        if not instance or not self.can_stop:
            return
        m = self.ledger.get(instance)
        if m is None:
            m = self.ledger.add(Machine(instance, market, [uid], self.clock(), state=STOPPING))
        if m.state == STOPPED:
            return
        if m.state != STOPPING or not m.stop_why:
            m.stop_why = why
            self.ledger.set_state(m, STOPPING)
            self.ledger.touch(m)
        self._manifests.setdefault(instance, manifest)
        self.retry_due()

    def retry_due(self) -> None:
        """Submit every stop that is due (the ledger's stopping machines: a restarted controller
        goes on with the stops the last one had not finished)."""
        now = self.clock()
        for m in self.ledger.live():
            if m.state != STOPPING or now < self._next_at.get(m.instance_id, 0.0):
                continue
            if m.instance_id in self._asked or self.launcher.since(PREFIX + m.instance_id) is not None:
                continue
            instance = m.instance_id
            self._asked.add(instance)
            self.launcher.submit(
                PREFIX + instance, functools.partial(self.provider.stop, instance), timeout_s=self.timeout_s
            )

    def outcome(self, outcome: Outcome) -> bool:
        """Record a finished stop; False when the outcome is not a stop."""
        if not outcome.key.startswith(PREFIX):
            return False
        instance = outcome.key[len(PREFIX) :]
        self._asked.discard(instance)
        m = self.ledger.get(instance)
        if m is None or m.state == STOPPED:
            return True
        manifest = self._manifests.get(instance) or {}
        name = str(manifest.get("name") or "")
        uid = m.jobs[0] if m.jobs else ""
        now = self.clock()
        if outcome.error is None:
            m.stopped_at, m.stop_error = now, ""
            self.ledger.set_state(m, STOPPED)
            self.ledger.price(m)
            self.say(
                f"job {uid[:12]} ({name}): machine {instance} stopped ({m.stop_why}): {self.redact(str(outcome.value))}"
            )
            return True
        m.stop_tries += 1
        m.stop_error = self.redact(str(outcome.error))[:500]
        code, name = error_code(outcome.error), getattr(self.provider, "name", "?")
        log.warning("provider %s: stop %s failed (%s), try %d: %s", name, instance, code, m.stop_tries, m.stop_error)
        self.ledger.touch(m)
        self._next_at[instance] = now + backoff_s(m.stop_tries - 1, self.poll_s, MAX_BACKOFF_S)
        self.event(
            f"{uid}:stop_failed:{instance}",  # once per machine: the retries are said in `orch status`
            EventKind.STOP_FAILED,
            manifest,
            f"job {uid[:12]} ({name}): machine {instance} could not be stopped ({m.stop_why}): {m.stop_error}; "
            "orch tries again with backoff until it is stopped (`orch status --url` shows each try)",
        )
        return True


def _line(m: Machine) -> str:
    if m.state == STOPPED:
        return "stopped"
    if m.stop_tries >= SAY_HAND_AFTER:
        return f"could not be stopped in {m.stop_tries} tries ({m.stop_error[:120]}); still trying: stop it by hand"
    return f"stopping (try {m.stop_tries + 1})" + (f"; last: {m.stop_error[:120]}" if m.stop_error else "")
