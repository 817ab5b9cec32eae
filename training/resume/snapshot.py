"""Periodic checkpoints off the training step: the step blocks only while the state is copied
(a snapshot: every tensor copied to host memory, everything else deep-copied), then a background
thread writes it the way every checkpoint is written (temp file, fsync, rename, fsync the folder,
retention; training.resume.checkpoints.AtomicCheckpointIO) while training goes on. The daemon's mirror
uploads the file once it appears (CheckFreq's split; torch.distributed.checkpoint.async_save's too).

- The snapshot is taken at the same point a synchronous save would serialise, so the file holds
  the same values, and an exact resume from it stays bit-identical.
- At most one write in flight: a new periodic save waits for the previous write first (memory
  stays at one snapshot; that wait is blocking time only when writes are slower than the interval).
- Notice checkpoints are never deferred: they are written synchronously and are durable before the
  job exits 75. A periodic write still in flight then is abandoned (its temp file is removed at the
  next start); the notice checkpoint is newer anyway.
- Before the first snapshot, training/resume/memory_guard.py weighs the state against the host memory
  left; a state too big to copy is saved synchronously instead, with one warning.
- An error of a background write (a full disk) is raised in the training thread at the next save,
  or when training ends; the end of training waits for the last write (the final checkpoint)."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any, Optional

import torch

from training.resume import memory_guard
from training.resume.checkpoints import AtomicCheckpointIO, is_notice, step_of


def snapshot(
    obj: Any,
    memo: Optional[dict[int, Any]] = None,
    buffers: Optional[dict[tuple, torch.Tensor]] = None,
    where: tuple = (),
) -> Any:
    """A copy of a checkpoint dict that later training steps cannot change: tensors copied to host
    memory (a tensor seen twice stays one copy), containers rebuilt, anything else deep-copied.
    With `buffers` (kept between saves), a tensor is copied into the host buffer the previous
    snapshot used at the same place when shape and dtype match: allocating (page-faulting) 1.3 GB
    of fresh memory per save costs more than the copy itself."""
    memo = {} if memo is None else memo
    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        buf = buffers.get(where) if buffers is not None else None
        if buf is not None and buf.shape == src.shape and buf.dtype == src.dtype and src.layout == torch.strided:
            out: Any = buf.copy_(src)
        else:
            out = src.to("cpu", copy=True)
            if buffers is not None:
                buffers[where] = out
    elif isinstance(obj, dict):
        out = type(obj)() if type(obj) is not dict else {}
        memo[key] = out
        for k, v in obj.items():
            out[k] = snapshot(v, memo, buffers, where + (k,))
        return out
    elif isinstance(obj, list):
        out = []
        memo[key] = out
        out.extend(snapshot(v, memo, buffers, where + (i,)) for i, v in enumerate(obj))
        return out
    elif isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        out = tuple(snapshot(v, memo, buffers, where + (i,)) for i, v in enumerate(obj))
    elif isinstance(obj, (str, int, float, bool, type(None), bytes)):
        return obj
    else:
        out = copy.deepcopy(obj)
    memo[key] = out
    return out


class BackgroundCheckpointIO(AtomicCheckpointIO):
    """AtomicCheckpointIO whose periodic saves are written by a background thread."""

    def __init__(self, keep: Optional[int] = None):
        super().__init__(keep=keep)
        self._writer = AtomicCheckpointIO(keep=keep)  # its own last_save: the notice line reads ours
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._noticed = False
        self.last_snapshot: dict[str, float] = {}  # blocking seconds of the latest periodic save
        self.last_background: dict[str, float] = {}  # the background write's timings
        self._buffers: dict[tuple, torch.Tensor] = {}  # host copies reused by the next snapshot
        self.memory: Optional[dict[str, Any]] = None  # memory_guard's decision, made at the first periodic save

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if step_of(path) is None or is_notice(path):
            if is_notice(path):
                self._noticed = True
            super().save_checkpoint(checkpoint, path, storage_options)  # synchronous and durable
            return
        if self.memory is None:
            self.memory = memory_guard.check(checkpoint)
        if not self.memory["background"]:  # a host copy would not fit: written in the step, as a notice is
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        t0 = time.perf_counter()
        self.wait()  # one write in flight at most (its buffers are free again); raises its error here
        t1 = time.perf_counter()
        frozen = snapshot(checkpoint, buffers=self._buffers)
        t2 = time.perf_counter()
        self.last_snapshot = {"wait_s": t1 - t0, "snapshot_s": t2 - t1, "blocked_s": t2 - t0}
        self._thread = threading.Thread(
            target=self._write, args=(frozen, Path(path)), daemon=True, name="checkpoint-writer"
        )
        self._thread.start()

    def _write(self, frozen: dict[str, Any], path: Path) -> None:
        try:
            self._writer.save_checkpoint(frozen, path)
            self.last_background = dict(self._writer.last_save)
        except BaseException as exc:  # handed to the training thread
            self._error = exc

    def wait(self) -> None:
        """Wait for the write in flight; raise its error, if it had one."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def teardown(self) -> None:
        # After a notice the job exits 75 at once: a periodic write still in flight is abandoned.
        if not self._noticed:
            self.wait()
        super().teardown()
