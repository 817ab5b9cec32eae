"""Provider calls (launches, stops and "is it alive?") off the controller's polling loop.

A launch command that hangs, or an EC2 call that crawls, must not stall the controller: while it
runs, every other job is still watched and placed. `Launcher` runs each call on a small thread
pool; the controller asks each pass what has finished (`finished()`) and records it itself, on its
own thread (the store and the claims are written by the loop only). A call still running past
its own bound (`timeout_s`, or the one given with the call: an alive question's is short) is reported
as failed by timeout (a thread cannot be killed; the providers bound their own calls -- the command
provider kills its command's whole process group at the same limit -- so this is the last net).
A pool whose every worker is held by a call running past a poll says so (`held`), so `orch watch`
and `orch status --url` show it instead of queueing silently -- the calls reported past their bound
included: their threads stay held until the call returns, and are counted until then.

`InlineLauncher` runs the call at once, on the caller's thread: the controller's tests and the
market benchmark's simulated clock, where a pass must see its own launch's outcome."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional

WORKERS = 4  # provider calls at once; more jobs lost at once wait their turn (and say so)


@dataclass
class Outcome:
    key: str  # what the controller called the call: "launch:<uid>:<n>", "stop:<instance>"
    value: Any = None  # what the call returned
    error: Optional[BaseException] = None  # what it raised (or a TimeoutError past timeout_s)


def short(key: str) -> str:
    """A call's key as a person reads it: its first job (a group's key names them all)."""
    return key.split(",")[0][:60]


def error_code(error: BaseException) -> str:
    """A provider call's error, for the log: the cloud's own code (botocore's ClientError) or its class."""
    response = getattr(error, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return str(code or type(error).__name__)


class Launcher:
    def __init__(self, timeout_s: float, *, workers: int = WORKERS, clock: Callable[[], float] = time.time):
        self.timeout_s = timeout_s
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="orch-launch")
        self.workers = workers
        self._running: dict[str, tuple[float, Future[Any], float]] = {}
        # Calls reported past their bound that still hold their worker: (key, started, future).
        self._abandoned: list[tuple[str, float, Future[Any]]] = []
        self._lock = threading.Lock()

    def submit(self, key: str, call: Callable[[], Any], *, timeout_s: Optional[float] = None) -> None:
        """Run `call` off the loop, unless a call of that key is still running."""
        with self._lock:
            if key in self._running:
                return
            self._running[key] = (self.clock(), self._pool.submit(call), timeout_s or self.timeout_s)

    def held(self, longer_than_s: float) -> list[tuple[str, float]]:
        """(key as shown, seconds running) of every call running longer than `longer_than_s` -- and
        of every call past its bound still running -- when they hold every worker (further calls
        wait for one); else []."""
        now = self.clock()
        with self._lock:
            self._abandoned = [a for a in self._abandoned if not a[2].done()]
            running = self._running.items()
            long = [(short(k), now - v[0]) for k, v in running if v[1].running() and now - v[0] > longer_than_s]
            long += [(f"{short(k)} (past its bound)", now - t) for k, t, f in self._abandoned if f.running()]
        return sorted(long) if len(long) >= self.workers else []

    def waiting(self) -> int:
        """Calls submitted that no worker has started yet."""
        with self._lock:
            return sum(1 for v in self._running.values() if not v[1].running() and not v[1].done())

    def since(self, key: str) -> Optional[float]:
        """When the call `key` started, while it runs; None when it is not running."""
        with self._lock:
            got = self._running.get(key)
        return got[0] if got else None

    def finished(self) -> list[Outcome]:
        """The calls that returned, raised or ran past timeout_s since the last time (each once)."""
        out = []
        now = self.clock()
        with self._lock:
            for key, (started, future, limit_s) in list(self._running.items()):
                if future.done():
                    exc = future.exception()
                    out.append(Outcome(key, None if exc else future.result(), exc))
                elif now - started > limit_s:
                    if not future.cancel():  # running: its worker stays held until it returns
                        self._abandoned.append((key, started, future))
                    out.append(Outcome(key, error=TimeoutError(f"did not return within {limit_s:.0f} s")))
                else:
                    continue
                del self._running[key]
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class InlineLauncher:
    """The same interface, each call run at once on the caller's thread."""

    def __init__(self) -> None:
        self._done: list[Outcome] = []

    def submit(self, key: str, call: Callable[[], Any], *, timeout_s: Optional[float] = None) -> None:
        try:
            self._done.append(Outcome(key, call()))
        except Exception as exc:  # the controller decides what each error means
            self._done.append(Outcome(key, error=exc))

    def since(self, key: str) -> Optional[float]:
        return None

    def held(self, longer_than_s: float) -> list[tuple[str, float]]:
        return []

    def waiting(self) -> int:
        return 0

    def finished(self) -> list[Outcome]:
        out, self._done = self._done, []
        return out

    def close(self) -> None:
        pass
