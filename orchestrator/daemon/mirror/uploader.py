"""The uploader's thread: one pass at a time (scan, upload, manifests and files), a preemption
notice, draining at shutdown and releasing the leases. The parts a pass is made of live beside
it: uploads.py, lease.py, files.py, events.py."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ...spec.config import Config
from ...contract import CHECKPOINTS
from ...home.paths import Home
from ...model.records import Job
from ...model.states import TERMINAL, EventKind, JobState
from ...objectstore import manifest as mf
from ...objectstore.remote import Remote, StorageError
from ...objectstore.signing import keys_from
from ...store import Store
from .events import Outage
from .files import FileSync
from .lease import ACTIVE, ManifestWriter
from .machine import MachineIdentity
from .moves import MoveWatch
from .stall import StallWatch
from .uploads import UploadQueue

log = logging.getLogger("orch.mirror")

_WATCH_S = 0.1  # how often the checkpoint folders are looked at between passes


class Mirror:
    def __init__(
        self,
        home: Home,
        config: Config,
        store: Store,
        *,
        on_lease_lost: Optional[Callable[[Job, str], None]] = None,
        on_event: Optional[Callable[[EventKind, str], None]] = None,
        on_move: Optional[Callable[[Job, str], None]] = None,
        remote: Optional[Remote] = None,
    ):
        self.home, self.config, self.store = home, config, store
        self.s = config.storage
        self.remote = remote or Remote(self.s)
        self.passes = 0  # passes done: the daemon's counters (home/wake.counters)
        self.started_at = time.time()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        home_id = mf.home_identity(home)
        self.uploads = UploadQueue(home, store, self.s, self.remote, home_id, self.stopping, self._commit)
        self.machine = MachineIdentity(config.preemption)
        self.manifests = ManifestWriter(
            home,
            store,
            self.remote,
            home_id,
            on_lease_lost or (lambda job, holder: None),
            self.machine.instance_id,
            keys=keys_from(self.s, os.environ),
        )
        self.files = FileSync(home, store, self.s, self.remote)
        self.moves = MoveWatch(
            self.remote, home_id, on_move or (lambda job, reason: None), every_s=self.s.heartbeat_seconds
        )
        self.outage = Outage(store, self.remote, on_event or (lambda kind, detail: None))
        self.stall_watch = StallWatch(self.remote, self.uploads, self.outage, self.stopping)
        self._thread: Optional[threading.Thread] = None
        self._busy = threading.Event()  # a pass is running
        self._watched: list[Path] = []  # the active jobs' checkpoint folders, as of the last pass

    @property
    def urgent(self) -> bool:
        """A preemption notice or a stopping daemon: notice checkpoints at full speed."""
        return self.uploads.urgent

    @urgent.setter
    def urgent(self, value: bool) -> None:
        self.uploads.urgent = value

    # -- thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="mirror", daemon=True)
        self._thread.start()
        self.stall_watch.start()

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
                self.passes += 1
            self._wait(0.2 if self.urgent else 1.0)

    def _wait(self, timeout: float) -> None:
        """Until poked, `timeout` passes, or a watched checkpoint folder changes (a checkpoint renamed
        into place changes its folder's mtime): the upload starts within ~0.1 s of the checkpoint
        appearing, not at the next pass. A stat per active job every 0.1 s."""
        deadline = time.monotonic() + timeout
        seen = _stamps(self._watched)
        while not self.wake.wait(min(_WATCH_S, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or _stamps(self._watched) != seen:
                break
        self.wake.clear()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.wake.set()
        self.uploads.cancel_current(lambda row: True)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- notice and shutdown -----------------------------------------------------------------------

    def on_notice(self) -> None:
        """A preemption notice (or the daemon stopping): drop any periodic upload in flight so the
        notice checkpoint the jobs are writing now gets the whole link."""
        if not self.urgent:
            log.info("mirror: preemption notice: dropping periodic uploads in flight; notice checkpoints go first")
        self.urgent = True
        self.uploads.cancel_current(lambda row: not row["notice"])
        self.wake.set()

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
            try:  # (it goes out with this machine's next daemon, if there is one)
                self.scan(job, time.time())
            except Exception:
                log.exception("mirror: scan at shutdown failed")
        left = self.store.uploads_pending()
        if left:
            log.warning(
                "mirror: stopping with %d upload(s) unfinished after notice_deadline_seconds = %g; the mirror "
                "stays at the previous checkpoint (the steps since count as lost on adoption)",
                len(left),
                self.s.notice_deadline_seconds,
            )
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
            if row is None or (not row["lost"] and (row["dirty"] or self.manifests.changed(job))):
                out.append(job.id)
        return out

    # -- one pass ----------------------------------------------------------------------------------

    def pass_once(self, now: float) -> None:
        for job_id, row in self.store.mirror_states().items():
            if row["lost"] and self.store.get(job_id).state is JobState.QUEUED:  # requeued by a notice meanwhile
                self.manifests.on_lease_lost(self.store.get(job_id), f"adopted by {row['lost']}: cancelled here")
        try:
            jobs = self._jobs(now)
            self._watched = [self.home.run_dir(job.id) / CHECKPOINTS for job in jobs if job.state in ACTIVE]
            for job in jobs:  # finished ones too: the final checkpoint may be written just before the end
                self.scan(job, now)
            self.upload_pending()
            if self.stopping.is_set():
                return  # past the deadline: the manifests stay where they were (release_all follows)
            for job in jobs:
                self.sync_job(job, time.time())
        except StorageError as exc:
            self.outage.down(exc, time.time())
            return
        self.outage.up(time.time())

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
        self.uploads.scan(job, now)

    def upload_pending(self) -> None:
        self.uploads.upload_pending()

    def sync_job(self, job: Job, now: float) -> None:
        row = self.store.mirror_state(job.id)
        if row is not None and row["lost"]:
            return
        self.files.sync_files(job, now, row)
        self.files.sync_inputs(job)
        if job.state in TERMINAL and self.store.uploads_pending(job.id):
            return  # the last manifest names the last checkpoint: written once that is uploaded
        if job.state is JobState.SUCCEEDED and (row is None or not row["final"]):
            self.files.upload_outputs(job)
        due = (
            row is None
            or row["dirty"]
            or self.manifests.changed(job)
            or (job.state in ACTIVE and now - (row["manifest_at"] or 0) >= self.s.heartbeat_seconds)
            or (job.state in TERMINAL and not row["final"])
        )
        if due:
            self.write_manifest(job, row, now, released=job.state in TERMINAL)
        if job.state in ACTIVE:  # once a heartbeat (even when checkpoints write the manifest): a move asked?
            self.moves.check(job, now)

    def _commit(self, job_id: int) -> None:
        """A checkpoint was just uploaded: an active job's manifest names it now (a finished job's
        last manifest waits for its outputs, in sync_job; a stopping daemon's for release_all)."""
        if self.stopping.is_set():
            return
        job = self.store.get(job_id)
        if job.state in ACTIVE:
            self.write_manifest(job, self.store.mirror_state(job_id), time.time())

    def write_manifest(self, job: Job, row: Optional[dict[str, Any]], now: float, *, released: bool = False) -> None:
        self.manifests.write(
            job,
            row,
            now,
            released=released,
            data_files=self.files.inputs.get(job.id),
            provenance=self.files.provenance_sent(job.id),
        )


def _stamps(folders: list[Path]) -> list[Optional[int]]:
    out: list[Optional[int]] = []
    for folder in folders:
        try:
            out.append(os.stat(folder).st_mtime_ns)
        except OSError:
            out.append(None)
    return out
