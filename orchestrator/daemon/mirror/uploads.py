"""The mirror's upload queue (the `uploads` table: it survives a daemon restart): which checkpoint
to queue, uploading the pending ones under immutable keys with backoff on failure, giving way
to notice checkpoints, and the job's checkpoint history with its retention."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ...backoff import backoff_s
from ...contract import CHECKPOINTS, step_checkpoints
from ...paths import Home
from ...records import Job
from ...states import JobState
from ...storage import manifest as mf
from ...storage.packing import PACKED_TAR, pack_folder
from ...storage.remote import Remote, StorageError, sha256_file
from ...store import Store

log = logging.getLogger("orch.mirror")

_BACKOFF_BASE_S, _BACKOFF_MAX_S = 1.0, 30.0


class UploadQueue:
    def __init__(self, home: Home, store: Store, storage: Any, remote: Remote, stopping: threading.Event):
        self.home, self.store, self.s, self.remote = home, store, storage, remote
        self.stopping = stopping
        self.urgent = False  # a preemption notice or a stopping daemon: notice checkpoints at full speed
        self._current: Optional[tuple[asyncio.AbstractEventLoop, asyncio.Task, dict[str, Any]]] = None
        self._current_lock = threading.Lock()

    def scan(self, job: Job, now: float) -> None:
        row = self.store.mirror_state(job.id)
        mirrored = {c["name"] for c in (row or {}).get("checkpoints", [])}
        newest_known = max(((c["step"], int(c["notice"])) for c in (row or {}).get("checkpoints", [])), default=None)
        known = self.store.upload_names(job.id) | mirrored
        for path, parsed in step_checkpoints(self.home.run_dir(job.id) / CHECKPOINTS):
            if newest_known is not None and parsed.order <= newest_known:
                break
            if path.name not in known:
                self.store.upload_enqueue(job.id, job.uid, str(path), path.name, parsed.step, parsed.notice, now)
                log.info("mirror: job %s: queued %s", job.id, path.name)
            break  # only the newest: older ones would be superseded at once

    def upload_pending(self) -> None:
        for row in self.store.uploads_pending():
            if self.stopping.is_set():
                return
            if row["next_try_at"] > time.time():
                continue
            if self.should_yield(row):
                continue  # jobs are writing their notice checkpoints: keep the link for those
            self._upload(row)

    def should_yield(self, row: dict[str, Any]) -> bool:
        """A periodic upload gives way while a notice stands and jobs are still writing notice checkpoints."""
        return self.stopping.is_set() or (self.urgent and not row["notice"] and bool(self.store.jobs([JobState.RUNNING])))

    def cancel_current(self, which: Callable[[dict[str, Any]], bool]) -> None:
        with self._current_lock:
            current = self._current
        if current is not None and which(current[2]):
            loop, task, _row = current
            loop.call_soon_threadsafe(task.cancel)

    def _upload(self, row: dict[str, Any]) -> None:
        now = time.time()
        mrow = self.store.mirror_state(row["job_id"])
        if mrow is not None and mrow["lost"]:
            self.store.upload_finish(row["id"], now, dropped="the job was adopted by another machine")
            return
        path = Path(row["path"])
        packed = None
        try:
            if path.is_dir():  # a Trainer checkpoint folder: one tar object (storage/packing.py)
                packed = PACKED_TAR
                path = pack_folder(path, path.parent.parent / ".mirror" / f"{row['name']}.tar")
            sha, size = sha256_file(path)
        except FileNotFoundError:
            self.store.upload_finish(row["id"], now, dropped="deleted locally before it was uploaded")
            return
        if self.should_yield(row):  # a notice arrived while hashing: it stays queued
            log.info("mirror: job %s: upload of %s gives way to a notice checkpoint", row["job_id"], row["name"])
            return
        key = mf.checkpoint_key(row["uid"], row["name"], sha)
        notice = bool(row["notice"])
        concurrency = self.s.notice_concurrency if (notice or self.urgent) else self.s.concurrency
        started = time.monotonic()
        try:
            self._run_cancellable(row, self.remote.put_file_async(key, path, concurrency=concurrency))
        except asyncio.CancelledError:  # it stays queued: it goes again later unless a newer one supersedes it
            why = "the daemon stopped (notice_deadline_seconds)" if self.stopping.is_set() else "a notice checkpoint"
            log.info("mirror: job %s: upload of %s dropped for %s", row["job_id"], row["name"], why)
            return
        except StorageError as exc:
            delay = backoff_s(row["tries"], _BACKOFF_BASE_S, _BACKOFF_MAX_S)
            self.store.upload_retry(row["id"], time.time() + delay, str(exc))
            raise
        took = time.monotonic() - started
        record = {"name": row["name"], "step": row["step"], "notice": notice, "key": key, "sha256": sha, "bytes": size,
                  "uploaded_at": time.time(), "upload_s": round(took, 3)}
        if packed:
            record["packed"] = packed
            path.unlink(missing_ok=True)
        self.store.upload_finish(row["id"], time.time())
        self._add_checkpoint(row["job_id"], row["uid"], record)
        log.info("mirror: job %s: uploaded %s (%.1f MB in %.2f s, %.0f MB/s)", row["job_id"], row["name"], size / 1e6,
                 took, size / 1e6 / took if took > 0 else 0)

    def _run_cancellable(self, row: dict[str, Any], coro: Any) -> Any:
        loop = asyncio.new_event_loop()
        try:
            task = loop.create_task(coro)
            with self._current_lock:
                self._current = (loop, task, row)
            if self.should_yield(row):  # a notice between the check and now
                task.cancel()
            return loop.run_until_complete(task)
        finally:
            with self._current_lock:
                self._current = None
            loop.close()

    def _add_checkpoint(self, job_id: int, uid: str, record: dict[str, Any]) -> None:
        row = self.store.mirror_state(job_id) or {"checkpoints": [], "doomed": []}
        history = [c for c in row["checkpoints"] if c["name"] != record["name"]] + [record]
        history.sort(key=lambda c: (c["step"], int(c["notice"])), reverse=True)
        keep, doomed = history[: self.s.keep], [c["key"] for c in history[self.s.keep:]]
        self.store.mirror_set(job_id, uid, checkpoints=keep, doomed=list(row["doomed"]) + doomed, dirty=1,
                              step=keep[0]["step"], uploaded_at=record["uploaded_at"])
