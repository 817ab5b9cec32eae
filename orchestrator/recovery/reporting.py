"""The controller's events (machine_lost, relaunched, capacity_wait, ...): recorded once per key in
its store, queued for the configured notifications, and said on `orch watch`'s output."""

from __future__ import annotations

import socket
from typing import Any, Callable

from ..jobs.lifecycle import outgoing_for
from ..model.states import EventKind
from ..spec.config import Config
from ..store import Store


class Events:
    def __init__(self, config: Config, store: Store, clock: Callable[[], float], say: Callable[[str], None]):
        self.config, self.store, self.clock, self.say = config, store, clock, say
        self.host = socket.gethostname()

    def report(self, key: str, kind: EventKind, m: dict[str, Any], detail: str) -> None:
        payload = {
            "event": kind.value,
            "job_name": str(m.get("name") or ""),
            "state": str(m.get("state") or ""),
            "reason": detail,
            "host": self.host,
        }
        if self.store.recovery_event(key, kind.value, detail, self.clock(), outgoing_for(self.config, kind, payload)):
            self.say(f"{kind.value}: {detail}")
