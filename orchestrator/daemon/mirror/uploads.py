"""The mirror's upload queue (the `uploads` table: it survives a daemon restart): which checkpoint
to queue, uploading the pending ones under immutable keys with backoff on failure, giving way
to notice checkpoints, and the job's checkpoint history with its retention."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ...jobs.backoff import backoff_s
from ...contract import CHECKPOINTS, step_checkpoints
from ...home.paths import Home
from ...model.records import Job
from ...model.states import JobState
from ...objectstore import manifest as mf
from ...objectstore.packing import PACKED_TAR, pack_folder
from ...objectstore.remote import Remote, StorageError
from ...store import Store

log = logging.getLogger("orch.mirror")

_BACKOFF_BASE_S, _BACKOFF_MAX_S = 1.0, 30.0


class UploadQueue:
    def __init__(
        self,
        home: Home,
        store: Store,
        storage: Any,
        remote: Remote,
        home_id: str,
        stopping: threading.Event,
        on_uploaded: Callable[[int], None],
    ):
        self.home, self.store, self.s, self.remote, self.home_id = home, store, storage, remote, home_id
        self.stopping = stopping
        self.on_uploaded = on_uploaded
        self.urgent = False  # a preemption notice or a stopping daemon: notice checkpoints at full speed
        self._current: Optional[tuple[asyncio.AbstractEventLoop, asyncio.Task, dict[str, Any]]] = None
        self._current_since = 0.0  # time.monotonic() when the upload in flight began
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
            if self._upload(row):
                self.on_uploaded(row["job_id"])  # its manifest at once: the commit point, not after the other uploads

    def should_yield(self, row: dict[str, Any]) -> bool:
        """A periodic upload gives way while a notice stands and jobs are still writing notice checkpoints."""
        return self.stopping.is_set() or (
            self.urgent and not row["notice"] and bool(self.store.jobs([JobState.RUNNING]))
        )

    def cancel_current(self, which: Callable[[dict[str, Any]], bool]) -> None:
        with self._current_lock:
            current = self._current
        if current is not None and which(current[2]):
            loop, task, _row = current
            loop.call_soon_threadsafe(task.cancel)

    def in_flight(self) -> Optional[tuple[float, str]]:
        """(monotonic start, checkpoint name) of the upload running now, if any (stall.py asks)."""
        with self._current_lock:
            return (self._current_since, self._current[2]["name"]) if self._current is not None else None

    def _upload(self, row: dict[str, Any]) -> bool:
        """One pending checkpoint: True when it is uploaded and in the job's history (its manifest
        is the caller's next step)."""
        now = time.time()
        mrow = self.store.mirror_state(row["job_id"])
        if mrow is not None and mrow["lost"]:
            self.store.upload_finish(row["id"], now, dropped="the job was adopted by another machine")
            return False
        path = Path(row["path"])
        packed = None
        key = mf.checkpoint_key(row["uid"], row["name"], upload_tag(self.home_id, row))
        notice = bool(row["notice"])
        concurrency = self.s.notice_concurrency if (notice or self.urgent) else self.s.concurrency
        started = time.monotonic()
        try:
            if path.is_dir():  # a Trainer checkpoint folder: one tar object (objectstore/packing.py)
                packed = PACKED_TAR
                path = pack_folder(path, path.parent.parent / ".mirror" / f"{row['name']}.tar")
            # the sha256 is taken from the bytes as they go out (one read of the file, no pass before the put)
            sha, size = self._run_cancellable(
                row, self.remote.put_file_hashed_async(key, path, concurrency=concurrency)
            )
        except FileNotFoundError:
            self.store.upload_finish(row["id"], now, dropped="deleted locally before it was uploaded")
            return False
        except asyncio.CancelledError:  # it stays queued: it goes again later unless a newer one supersedes it
            why = "the daemon stopped (notice_deadline_seconds)" if self.stopping.is_set() else "a notice checkpoint"
            log.info("mirror: job %s: upload of %s dropped for %s", row["job_id"], row["name"], why)
            return False
        except StorageError as exc:
            delay = backoff_s(row["tries"], _BACKOFF_BASE_S, _BACKOFF_MAX_S)
            self.store.upload_retry(row["id"], time.time() + delay, str(exc))
            raise
        took = time.monotonic() - started
        record = {
            "name": row["name"],
            "step": row["step"],
            "notice": notice,
            "key": key,
            "sha256": sha,
            "bytes": size,
            "uploaded_at": time.time(),
            "upload_s": round(took, 3),
        }
        if packed:
            record["packed"] = packed
            path.unlink(missing_ok=True)
        self._add_checkpoint(row, record)
        log.info(
            "mirror: job %s: uploaded %s (%.1f MB in %.2f s, %.0f MB/s)",
            row["job_id"],
            row["name"],
            size / 1e6,
            took,
            size / 1e6 / took if took > 0 else 0,
        )
        return True

    def _run_cancellable(self, row: dict[str, Any], coro: Any) -> Any:
        loop = asyncio.new_event_loop()
        try:
            task = loop.create_task(coro)
            with self._current_lock:
                self._current, self._current_since = (loop, task, row), time.monotonic()
            if self.should_yield(row):  # a notice between the check and now
                task.cancel()
            return loop.run_until_complete(task)
        finally:
            with self._current_lock:
                self._current = None
            loop.close()

    def _add_checkpoint(self, upload: dict[str, Any], record: dict[str, Any]) -> None:
        job_id, uid = upload["job_id"], upload["uid"]
        row = self.store.mirror_state(job_id) or {"checkpoints": [], "doomed": []}
        history = [c for c in row["checkpoints"] if c["name"] != record["name"]] + [record]
        history.sort(key=lambda c: (c["step"], int(c["notice"])), reverse=True)
        keep, doomed = history[: self.s.keep], [c["key"] for c in history[self.s.keep :]]
        # the same name uploaded again (a resumed attempt rewrote it): the old object goes with retention
        doomed += [c["key"] for c in row["checkpoints"] if c["name"] == record["name"] and c["key"] != record["key"]]
        self.store.upload_done(
            upload["id"],
            job_id,
            uid,
            time.time(),
            checkpoints=keep,
            doomed=list(row["doomed"]) + doomed,
            dirty=1,
            step=keep[0]["step"],
            uploaded_at=record["uploaded_at"],
        )


def upload_tag(home_id: str, upload: dict[str, Any]) -> str:
    """The key's tag for one queued upload: the same on a retry of that upload (a retry after a
    kill rewrites its own unnamed object instead of leaving one behind), and never the same for
    two uploads (this machine's id, the queue row and when it was queued)."""
    ident = f"{home_id}/{upload['uid']}/{upload['id']}/{upload['created_at']!r}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]
