"""`orch run`'s signals, as the supervisor hears them (executors/supervisor.py): SIGINT, SIGTERM and
SIGHUP mean "checkpoint and stop" (a second one kills), SIGUSR1 is the daemon's backstop, "kill
the job now". The handlers only count: a handler runs between any two bytecodes of the process,
inside a store transaction too, so every store write and signal to the job happens in `orch
run`'s loop, which a self-pipe (signal.set_wakeup_fd) wakes at once."""

from __future__ import annotations

import os
import select
import signal
from contextlib import contextmanager
from typing import Any, Iterator


class RunSignals:
    def __init__(self) -> None:
        self.stops = 0  # stop signals received, in all
        self.kill_now = False  # SIGUSR1 received, not yet acted on
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)

    def on_stop(self, _signum: int, _frame: Any) -> None:
        """Ctrl-C, a closed terminal, or the daemon acting on `orch cancel` (it signals the
        process it knows for the attempt: `orch run`)."""
        self.stops += 1

    def on_kill(self, _signum: int, _frame: Any) -> None:
        """SIGUSR1: the daemon's backstop for a job past its grace (LocalExecutor.kill)."""
        self.kill_now = True

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers and the wake-up pipe, for as long as the block runs (main thread only)."""
        previous = {s: signal.signal(s, self.on_stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self.on_kill)
        previous_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for s, handler in previous.items():
                signal.signal(s, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def wait(self, seconds: float) -> None:
        """Up to `seconds`, ended early by any signal (its handler's byte on the self-pipe)."""
        readable, _, _ = select.select([self._wake_r], [], [], max(0.0, seconds))
        if readable:
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
