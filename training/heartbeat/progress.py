"""progress.json off the training step: the heartbeat hands its newest snapshot to a writer thread
(the atomic write's fsyncs, and reading metric tensors back from the device, happen there), and
the moments that must be on disk before training goes on (start, end, a notice) write at once."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, Optional

from orchestrator.contract import write_json_atomic


def as_numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """Logged metrics as plain floats; a tensor on a GPU is read back here (a device sync), so this
    runs on the writer thread for heartbeats. Values that are not numbers are left out."""
    out = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError, RuntimeError):
            continue
    return out


class ProgressWriter:
    """One writer of one progress.json. `submit` keeps only the newest snapshot (a slow disk delays
    the file, never the step); `write_now` writes on the caller's thread, after and instead of a
    pending snapshot, so the file never goes back in time."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._io = threading.Lock()  # one write at a time, in order
        self._wake = threading.Condition()
        self._pending: Optional[tuple[int, dict[str, Any]]] = None
        self._thread: Optional[threading.Thread] = None
        self._taken = 0  # sequence number of the newest snapshot handed in
        self._written = 0  # ... and of the newest on disk
        self.writes = 0

    def submit(self, snapshot: dict[str, Any]) -> None:
        with self._wake:
            self._taken += 1
            self._pending = (self._taken, snapshot)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="orch-progress", daemon=True)
                self._thread.start()
            self._wake.notify()

    def write_now(self, snapshot: dict[str, Any]) -> None:
        with self._wake:
            self._taken += 1
            seq, self._pending = self._taken, None  # a pending one is older than this one
        self._write(seq, snapshot)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None:
                    self._wake.wait()
                (seq, snapshot), self._pending = self._pending, None
            self._write(seq, snapshot)

    def _write(self, seq: int, snapshot: dict[str, Any]) -> None:
        data = dict(snapshot, metrics=as_numbers(snapshot.get("metrics") or {}))
        with self._io:
            if seq < self._written:
                return  # the thread lost a race with write_now: never go back in time
            self._written = seq
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(self.path, data)
                self.writes += 1
            except OSError as exc:  # a full disk must not kill training
                print(f"[orch] could not write {self.path.name}: {exc}", file=sys.stderr, flush=True)
