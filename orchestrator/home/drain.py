"""`orch daemon drain`: the running jobs finish, nothing new starts, then the daemon exits — for
planned maintenance or a move to another instance. The request is a flag file in $ORCH_HOME
(written by the CLI, read by the daemon every tick, removed by the daemon when it exits; a daemon
that starts removes a leftover one: starting a daemon means running the queue), and `orch status`
can say the daemon is draining."""

from __future__ import annotations

import time
from typing import Optional

from ..contract import read_json, write_json_atomic
from .paths import Home

FLAG = "drain"


def request(home: Home, now: Optional[float] = None) -> None:
    write_json_atomic(home.root / FLAG, {"requested_at": time.time() if now is None else now})


def requested(home: Home) -> Optional[float]:
    """When a drain was asked for, or None."""
    data = read_json(home.root / FLAG)
    if data is None:
        return None
    at = data.get("requested_at")
    return float(at) if isinstance(at, (int, float)) else 0.0


def clear(home: Home) -> None:
    try:
        (home.root / FLAG).unlink()
    except FileNotFoundError:
        pass
