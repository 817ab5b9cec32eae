"""Stopping machines orch no longer needs: the old machine of a planned move once the job runs on
the new market, and a machine the controller launched whose jobs have all finished. The provider's
`stop` runs off the loop (launcher.py). A stop that fails is tried again with backoff (poll x 2^n,
capped), notified once (`stop_failed`), and given up after MAX_TRIES -- never a loop. A machine
stopped is remembered in the controller's store, so a restarted controller does not stop it twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..jobs.backoff import backoff_s
from ..model.states import EventKind
from .launcher import Outcome

MAX_TRIES = 5
MAX_BACKOFF_S = 1800.0
PREFIX = "stop:"


@dataclass
class Pending:
    instance: str
    uid: str
    why: str
    manifest: dict[str, Any]
    tries: int = 0
    next_at: float = 0.0
    error: str = ""


class Stopper:
    def __init__(
        self,
        provider: Any,
        launcher: Any,
        store: Any,
        clock: Callable[[], float],
        event: Callable[[str, EventKind, dict[str, Any], str], None],
        poll_s: float,
        redact: Callable[[str], str],
        say: Callable[[str], None],
    ):
        self.provider, self.launcher, self.store, self.clock = provider, launcher, store, clock
        self.event, self.poll_s, self.redact, self.say = event, poll_s, redact, say
        self._pending: dict[str, Pending] = {}  # instance -> its stop, while not done

    @staticmethod
    def done_key(instance: str) -> str:
        return f"stopped:{instance}"

    def stopped(self, instance: str) -> bool:
        return self.store.recovery_marked(self.done_key(instance))

    @property
    def can_stop(self) -> bool:
        return bool(getattr(self.provider, "can_stop", True))

    def state(self, instance: str) -> Optional[str]:
        """A line for the job's note while the stop is under way, or None."""
        if not self.can_stop:
            return "no [recovery] stop: left to its own [idle] shutdown"
        p = self._pending.get(instance)
        if p is None:
            return "stopped" if self.stopped(instance) else None
        if p.tries >= MAX_TRIES:
            return f"could not be stopped ({p.error[:120]}); stop it by hand"
        return f"stopping (try {p.tries + 1})" + (f"; last: {p.error[:120]}" if p.error else "")

    def want(self, instance: str, uid: str, why: str, manifest: dict[str, Any]) -> None:
        """Stop `instance` (once, with retries) unless it was stopped already."""
        if not instance or not self.can_stop or self.stopped(instance):
            return
        p = self._pending.setdefault(instance, Pending(instance, uid, why, manifest))
        if p.tries >= MAX_TRIES or self.clock() < p.next_at:
            return
        if self.launcher.since(PREFIX + instance) is not None:
            return
        self.launcher.submit(PREFIX + instance, lambda: self.provider.stop(instance))

    def outcome(self, outcome: Outcome) -> bool:
        """Record a finished stop; False when the outcome is not a stop."""
        if not outcome.key.startswith(PREFIX):
            return False
        instance = outcome.key[len(PREFIX) :]
        p = self._pending.get(instance)
        if p is None:
            return True
        name = str(p.manifest.get("name") or "")
        now = self.clock()
        if outcome.error is None:
            self.store.recovery_mark(self.done_key(instance), now)
            del self._pending[instance]
            self.say(
                f"job {p.uid[:12]} ({name}): machine {instance} stopped ({p.why}): {self.redact(str(outcome.value))}"
            )
            return True
        p.tries += 1
        p.error = self.redact(str(outcome.error))
        p.next_at = now + backoff_s(p.tries - 1, self.poll_s, MAX_BACKOFF_S)
        left = MAX_TRIES - p.tries
        self.event(
            f"{p.uid}:stop_failed:{instance}",  # once per machine: the retries are said in `orch status`
            EventKind.STOP_FAILED,
            p.manifest,
            f"job {p.uid[:12]} ({name}): machine {instance} could not be stopped ({p.why}): {p.error}; "
            + (f"orch tries {left} more time(s) with backoff" if left else "stop it by hand"),
        )
        return True
