"""Waiting for something that another process does: call a check until it answers, or give up.
One loop for the daemon's start and stop, the tests and the benchmarks."""

from __future__ import annotations

import time
from typing import Any, Callable


def poll(check: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Call `check` until it returns something truthy, and return that; after `timeout` seconds
    return its last (falsy) answer. It is always called at least once."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
