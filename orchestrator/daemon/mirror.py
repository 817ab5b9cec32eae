"""The daemon's uploader: every job's durable copy in [storage] (see storage/manifest.py for the
layout), off the training path. One thread, one persistent queue (the `uploads` table, the
outbox's pattern: it survives a daemon restart), one pass at a time:

1. scan: a checkpoint newer than the newest one queued or mirrored is queued; newest wins (the
   store drops older pending uploads of the same job);
2. upload the pending checkpoints, notice checkpoints first, under an immutable content-named
   key (sha256 first, then the put; a killed upload leaves no visible object);
3. write each changed job's manifest with a conditional write (If-Match on the ETag we wrote
   last, create for a new job): it names only complete uploads. A write that loses means another
   machine adopted the job: the job is stopped here with a checkpoint and its manifest is never
   written again. After the manifest, checkpoints it no longer names are deleted (retention);
4. progress, metrics, batch sizes and the current log, at most every throttle_seconds; on
   success the result and the exported model, then the last manifest.

The store being down never touches training: uploads wait with backoff, one `mirror_failed`
event (and notification) says so, `orch status` shows the lag, and `mirror_recovered` follows.
On a preemption notice the upload in flight is cancelled unless it is a notice checkpoint, and
the notice checkpoint goes out at [storage] notice_concurrency; a stopping daemon waits up to
notice_deadline_seconds for it, then releases its leases so `orch adopt` elsewhere needs no wait."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..backoff import backoff_s
from ..config import Config
from ..contract import BATCH, CHECKPOINTS, METRICS_CSV, MODEL, PROGRESS, RESULT, attempt_log, read_json, step_checkpoints
from ..paths import Home
from ..records import Job
from ..states import TERMINAL, EventKind, JobState
from ..storage import manifest as mf
from ..storage.remote import Conflict, Remote, StorageError, sha256_file
from ..store import Store
from ..storage.packing import PACKED_TAR, pack_folder

log = logging.getLogger("orch.mirror")

ACTIVE = (JobState.QUEUED, JobState.RUNNING)
_BACKOFF_BASE_S, _BACKOFF_MAX_S = 1.0, 30.0
_LOG_MAX_BYTES = 64 * 1024 * 1024  # a bigger log is not mirrored (its tail stays on the machine)


class Mirror:
    def __init__(self, home: Home, config: Config, store: Store, *,
                 on_lease_lost: Optional[Callable[[Job, str], None]] = None,
                 on_event: Optional[Callable[[EventKind, str], None]] = None,
                 remote: Optional[Remote] = None):
        self.home, self.config, self.store = home, config, store
        self.s = config.storage
        self.remote = remote or Remote(self.s)
        self.home_id = mf.home_identity(home)
        self.on_lease_lost = on_lease_lost or (lambda job, holder: None)
        self.on_event = on_event or (lambda kind, detail: None)
        self.started_at = time.time()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.urgent = False  # a preemption notice or a stopping daemon: notice checkpoints at full speed
        self.down_since: Optional[float] = None
        self.down_error = ""
        self.warned = False
        self._thread: Optional[threading.Thread] = None
        self._current: Optional[tuple[asyncio.AbstractEventLoop, asyncio.Task, dict[str, Any]]] = None
        self._current_lock = threading.Lock()
        self._written: dict[int, tuple[Any, ...]] = {}  # job id -> what its last manifest said
        self._files_seen: dict[tuple[int, str], tuple[float, int]] = {}
        self._data: dict[int, list[dict[str, Any]]] = {}  # job id -> its input files (storage/datafiles.py)
        self._hashes: dict[tuple[str, float, int], str] = {}
        self._busy = threading.Event()  # a pass is running

    # -- thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="mirror", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self.wake.set()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self._busy.set()
            try:
                self.pass_once(time.time())
            except Exception:  # a bug here must never take the daemon down
                log.exception("mirror pass failed; the uploader goes on")
            finally:
                self._busy.clear()
            self.wake.wait(0.2 if self.urgent else 1.0)
            self.wake.clear()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.wake.set()
        self._cancel_current(lambda row: True)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- notice and shutdown -----------------------------------------------------------------------

    def on_notice(self) -> None:
        """A preemption notice (or the daemon stopping): drop any periodic upload in flight so the
        notice checkpoint the jobs are writing now gets the whole link."""
        if not self.urgent:
            log.info("mirror: preemption notice: dropping periodic uploads in flight; notice checkpoints go first")
        self.urgent = True
        self._cancel_current(lambda row: not row["notice"])
        self.wake.set()

    def _cancel_current(self, which: Callable[[dict[str, Any]], bool]) -> None:
        with self._current_lock:
            current = self._current
        if current is not None and which(current[2]):
            loop, task, _row = current
            loop.call_soon_threadsafe(task.cancel)

    def drain(self, deadline: float) -> bool:
        """Wait (until the monotonic `deadline`) for every pending upload and changed manifest to be
        written. True when everything is mirrored."""
        self.urgent = True
        while time.monotonic() < deadline:
            self.wake.set()
            if not self.store.uploads_pending() and not self._dirty_jobs():
                # one more full pass after the last upload, so the manifests name it
                time.sleep(0.1)
                while self._busy.is_set() and time.monotonic() < deadline:
                    time.sleep(0.05)
                if not self.store.uploads_pending() and not self._dirty_jobs():
                    return True
            time.sleep(0.1)
        for job in self.store.jobs(ACTIVE):  # a notice checkpoint written too late to be queued: queue it now
            try:                              # (it goes out with this machine's next daemon, if there is one)
                self.scan(job, time.time())
            except Exception:
                log.exception("mirror: scan at shutdown failed")
        left = self.store.uploads_pending()
        if left:
            log.warning("mirror: stopping with %d upload(s) unfinished after notice_deadline_seconds = %g; the mirror "
                        "stays at the previous checkpoint (the steps since count as lost on adoption)",
                        len(left), self.s.notice_deadline_seconds)
        return False

    def release_all(self) -> None:
        """`orch daemon stop`: write every active job's manifest once more with the lease released, so
        another machine can adopt at once. Runs after stop() (nothing else writes manifests then)."""
        for job in self.store.jobs(ACTIVE):
            row = self.store.mirror_state(job.id)
            if row is None or row["lost"]:
                continue
            try:
                self.write_manifest(job, row, time.time(), released=True)
            except StorageError as exc:
                log.warning("mirror: cannot release the lease of job %s: %s", job.id, exc)
                return
        log.info("mirror: leases released")

    def _dirty_jobs(self) -> list[int]:
        out = []
        states = self.store.mirror_states()
        for job in self.store.jobs(ACTIVE):
            row = states.get(job.id)
            if row is None or (not row["lost"] and (row["dirty"] or self._written.get(job.id) != self._fingerprint(job))):
                out.append(job.id)
        return out

    # -- one pass ----------------------------------------------------------------------------------

    def pass_once(self, now: float) -> None:
        for job_id, row in self.store.mirror_states().items():
            if row["lost"] and self.store.get(job_id).state is JobState.QUEUED:  # requeued by a notice meanwhile
                self.on_lease_lost(self.store.get(job_id), f"adopted by {row['lost']}: cancelled here")
        try:
            jobs = self._jobs(now)
            for job in jobs:  # finished ones too: the final checkpoint may be written just before the end
                self.scan(job, now)
            self.upload_pending()
            if self.stopping.is_set():
                return  # past the deadline: the manifests stay where they were (release_all follows)
            for job in jobs:
                self.sync_job(job, time.time())
        except StorageError as exc:
            self._down(exc, time.time())
            return
        self._up(time.time())

    def _jobs(self, now: float) -> list[Job]:
        """Active jobs, and finished ones whose last manifest is not written yet (only those seen by
        the mirror, or finished since it started: old history is not uploaded wholesale)."""
        states = self.store.mirror_states()
        out = []
        for job in self.store.jobs():
            row = states.get(job.id)
            if row is not None and row["lost"]:
                continue
            if job.state in ACTIVE:
                out.append(job)
            elif job.state in TERMINAL and (row is None or not row["final"]):
                if row is not None or (job.finished_at or 0) >= self.started_at:
                    out.append(job)
        return out

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
            if self._should_yield(row):
                continue  # jobs are writing their notice checkpoints: keep the link for those
            self._upload(row)

    def _should_yield(self, row: dict[str, Any]) -> bool:
        """A periodic upload gives way while a notice stands and jobs are still writing notice checkpoints."""
        return self.stopping.is_set() or (self.urgent and not row["notice"] and bool(self.store.jobs([JobState.RUNNING])))

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
        if self._should_yield(row):  # a notice arrived while hashing: it stays queued
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
            if self._should_yield(row):  # a notice between the check and now
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

    # -- manifests, files, results --------------------------------------------------------------------

    def _fingerprint(self, job: Job) -> tuple[Any, ...]:
        return (job.state.value, job.attempt, job.failures, job.priority, job.steps_lost)

    def sync_job(self, job: Job, now: float) -> None:
        row = self.store.mirror_state(job.id)
        if row is not None and row["lost"]:
            return
        self.sync_files(job, now, row)
        if job.kind == "builtin" and job.id not in self._data:
            self._data[job.id] = self.upload_inputs(job)
        if job.state in TERMINAL and self.store.uploads_pending(job.id):
            return  # the last manifest names the last checkpoint: written once that is uploaded
        if job.state is JobState.SUCCEEDED and (row is None or not row["final"]):
            self.upload_outputs(job)
        due = (row is None or row["dirty"] or self._written.get(job.id) != self._fingerprint(job)
               or (job.state in ACTIVE and now - (row["manifest_at"] or 0) >= self.s.heartbeat_seconds)
               or (job.state in TERMINAL and not row["final"]))
        if due:
            self.write_manifest(job, row, now, released=job.state in TERMINAL)

    def write_manifest(self, job: Job, row: Optional[dict[str, Any]], now: float, *, released: bool = False) -> None:
        job = self.store.get(job.id)  # the freshest state, cost and attempts
        row = row or {"checkpoints": [], "doomed": [], "etag": None, "final": 0}
        run_dir = self.home.run_dir(job.id)
        result = read_json(run_dir / RESULT) if job.state is JobState.SUCCEEDED else None
        model = None
        if job.state is JobState.SUCCEEDED and (run_dir / MODEL).is_dir():
            model = [mf.model_key(job.uid, rel) for rel in _files_under(run_dir / MODEL)]
        manifest = mf.build_manifest(
            job, self.store.attempts(job.id), home_id=self.home_id, checkpoints=row["checkpoints"],
            batch=read_json(run_dir / BATCH), progress=read_json(run_dir / PROGRESS), result=result, model=model,
            data_files=self._data.get(job.id), released=released, now=now)
        key = mf.manifest_key(job.uid)
        try:
            etag = self.remote.cas_put(key, mf.dump(manifest), row.get("etag"))
        except Conflict:
            holder = self._holder(key)
            if holder is None:  # written by this home (an adopt here): take its ETag, try again next pass
                got = self.remote.get_with_etag(key)
                self.store.mirror_set(job.id, job.uid, etag=got[1] if got else None, dirty=1)
                return
            self._lost(job, holder, now)
            return
        final = int(job.state in TERMINAL)
        self.store.mirror_set(job.id, job.uid, etag=etag, manifest_at=now, dirty=0, final=final, released=int(released),
                              error="", error_since=None)
        self._written[job.id] = self._fingerprint(job)
        for doomed in list(row.get("doomed") or []):
            self.remote.delete(doomed)  # the manifest that no longer names it is written
        if row.get("doomed"):
            self.store.mirror_set(job.id, job.uid, doomed=[])

    def _holder(self, key: str) -> Optional[str]:
        got = self.remote.get_with_etag(key)
        if got is None:
            return None
        try:
            current = mf.parse_manifest(got[0], self.remote.where(key))
        except ValueError:
            return "an unreadable manifest"
        own = current.get("owner") or {}
        if own.get("home_id") == self.home_id:
            return None
        return f"{own.get('host') or '?'} ({own.get('by') or 'orch'} {own.get('pid') or ''})".strip()

    def _lost(self, job: Job, holder: str, now: float) -> None:
        reason = f"adopted by {holder} through {self.remote.url.raw}: stopped here; this machine no longer writes its mirror"
        log.warning("mirror: job %s: %s", job.id, reason)
        self.store.mirror_set(job.id, job.uid, lost=holder, dirty=0)
        self.store.record_event(job.id, EventKind.LEASE_LOST, now, detail=reason)
        for pending in self.store.uploads_pending(job.id):
            self.store.upload_finish(pending["id"], now, dropped="the job was adopted by another machine")
        self.on_lease_lost(job, reason)

    def sync_files(self, job: Job, now: float, row: Optional[dict[str, Any]]) -> None:
        """progress.json, metrics.csv, batch.json and the current attempt's log, throttled and only
        when changed."""
        if row is not None and row.get("files_at") and now - row["files_at"] < self.s.throttle_seconds \
                and job.state in ACTIVE:
            return
        run_dir = self.home.run_dir(job.id)
        names = [PROGRESS, METRICS_CSV, BATCH] + ([attempt_log(job.attempt)] if job.attempt else [])
        for name in names:
            path = run_dir / name
            try:
                st = path.stat()
            except OSError:
                continue
            if st.st_size > _LOG_MAX_BYTES:
                continue
            seen = (st.st_mtime, st.st_size)
            if self._files_seen.get((job.id, name)) == seen:
                continue
            self.remote.put_bytes(mf.file_key(job.uid, name), path.read_bytes())
            self._files_seen[(job.id, name)] = seen
        self.store.mirror_set(job.id, job.uid, files_at=now)

    def upload_inputs(self, job: Job) -> list[dict[str, Any]]:
        """The job's local data files and model folder, fingerprinted, and uploaded once
        (content-addressed) when their total is within [storage] data_max_mb."""
        from ..storage import datafiles

        entries = datafiles.collect(job.spec, int(self.s.data_max_mb * 1e6), self._hashes)
        sent = datafiles.upload(self.remote, entries)
        if entries:
            total = sum(e["bytes"] for e in entries) / 1e6
            travels = "uploaded" if entries[0].get("key") else "fingerprinted only (above data_max_mb)"
            log.info("mirror: job %s: %d input file(s), %.1f MB, %s (%d new)", job.id, len(entries), total, travels, sent)
        return entries

    def upload_outputs(self, job: Job) -> None:
        run_dir = self.home.run_dir(job.id)
        if (run_dir / RESULT).exists():
            self.remote.put_bytes(mf.file_key(job.uid, RESULT), (run_dir / RESULT).read_bytes())
        folder = run_dir / MODEL
        if folder.is_dir():
            for rel in _files_under(folder):
                self.remote.put_file(mf.model_key(job.uid, rel), folder / rel, concurrency=self.s.concurrency)
            log.info("mirror: job %s: result and model uploaded", job.id)

    # -- the store being down ------------------------------------------------------------------------

    def _down(self, exc: StorageError, now: float) -> None:
        if self.down_since is None:
            self.down_since = now
        self.down_error = str(exc)
        for job in self.store.jobs(ACTIVE):
            row = self.store.mirror_state(job.id)
            if row is not None and not row["lost"] and not row["error"]:
                self.store.mirror_set(job.id, job.uid, error=str(exc), error_since=now)
        if not self.warned:
            self.warned = True
            detail = (f"the mirror cannot reach {self.remote.url.raw}: {exc}; training goes on, uploads wait and "
                      "retry (`orch status` shows the lag)")
            log.warning("mirror: %s", detail)
            self.on_event(EventKind.MIRROR_FAILED, detail)

    def _up(self, now: float) -> None:
        if self.down_since is None:
            return
        detail = f"the mirror reaches {self.remote.url.raw} again after {now - self.down_since:.0f} s; uploads catching up"
        log.info("mirror: %s", detail)
        self.down_since, self.down_error = None, ""
        if self.warned:
            self.warned = False
            self.on_event(EventKind.MIRROR_RECOVERED, detail)
        for job in self.store.jobs(ACTIVE):
            row = self.store.mirror_state(job.id)
            if row is not None and row["error"]:
                self.store.mirror_set(job.id, job.uid, error="", error_since=None)


def _files_under(folder: Path) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            out.append(str((Path(root) / name).relative_to(folder)))
    return sorted(out)


def build_mirror(rt: Any) -> Optional[Mirror]:
    """The runtime's uploader, wired to its daemon: a lost lease stops the job here with a
    checkpoint (its own intent: SIGTERM, exit 75, `stopped`), or cancels it if it is queued; the
    store going down and coming back are recorded events with notifications."""
    if not rt.config.storage.url:
        return None
    import socket

    from ..lifecycle import outgoing_for
    from . import stop_requests

    d = rt.daemon

    def lease_lost(job: Job, reason: str) -> None:
        now = time.time()
        with d.lock:
            stop_requests.stop_for_lost_lease(d, job.id, reason, now)

    def event(kind: EventKind, detail: str) -> None:
        payload = {"event": kind.value, "reason": detail, "host": socket.gethostname(), "state": "",
                   "currency": rt.config.pricing.currency}
        rt.store.record_event(None, kind, time.time(), detail=detail, outgoing=outgoing_for(rt.config, kind, payload))
        rt.hooks.submit_event(kind.value, None)

    return Mirror(rt.home, rt.config, rt.store, on_lease_lost=lease_lost, on_event=event)
