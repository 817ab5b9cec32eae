"""Each job's manifest, the commit point of its copy, and the owner lease it carries: written with a
conditional write (If-Match on the ETag we wrote last, create for a new job). A write that loses
means another machine adopted the job: it is stopped here and its manifest never written again.
After a manifest, the checkpoints it no longer names are deleted (retention)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Optional

from ...contract import BATCH, MODEL, PROGRESS, RESULT, read_json
from ...home.paths import Home
from ...model.records import Job
from ...model.states import TERMINAL, Intent, JobState
from ...objectstore import machines, signing
from ...objectstore import manifest as mf
from ...objectstore.remote import Conflict, Remote
from ...store import Store

log = logging.getLogger("orch.mirror")

ACTIVE = (JobState.QUEUED, JobState.RUNNING)  # the jobs whose lease this machine holds and heartbeats


class ManifestWriter:
    def __init__(
        self,
        home: Home,
        store: Store,
        remote: Remote,
        home_id: str,
        on_lease_lost: Callable[[Job, str], None],
        instance_id: Callable[[float], Optional[str]] = lambda now: None,
        keys: Optional[signing.Keys] = None,
    ):
        self.home, self.store, self.remote, self.home_id = home, store, remote, home_id
        self.keys = keys  # the bucket key: every manifest, each lease renewal too, is signed with it
        self.on_lease_lost = on_lease_lost
        self.instance_id = instance_id  # this machine's cloud id for the lease (machine.py), or None
        self._written: dict[int, tuple[Any, ...]] = {}  # job id -> what its last manifest said
        self._last_at: dict[int, float] = {}  # job id -> the written_at of the last manifest written here

    @staticmethod
    def fingerprint(job: Job) -> tuple[Any, ...]:
        return (job.state.value, job.attempt, job.failures, job.priority, job.steps_lost)

    def changed(self, job: Job) -> bool:
        """The job changed since this process last wrote its manifest (or never wrote it)."""
        return self._written.get(job.id) != self.fingerprint(job)

    def write(
        self,
        job: Job,
        row: Optional[dict[str, Any]],
        now: float,
        *,
        released: bool = False,
        data_files: Optional[list[dict[str, Any]]] = None,
        provenance: Optional[list[str]] = None,
    ) -> None:
        job = self.store.get(job.id)  # the freshest state, cost and attempts
        row = row or {"checkpoints": [], "doomed": [], "etag": None, "final": 0}
        if job.state in TERMINAL and not released:
            # The job ended after the caller read it (an upload's commit racing the reap): its last
            # manifest is sync_job's, released in the same write and naming the last checkpoint and
            # the outputs. A terminal manifest is never written unreleased (docs/mirror.md).
            self.store.mirror_set(job.id, job.uid, dirty=1)
            return
        run_dir = self.home.run_dir(job.id)
        result = read_json(run_dir / RESULT) if job.state is JobState.SUCCEEDED else None
        model = None
        if job.state is JobState.SUCCEEDED and (run_dir / MODEL).is_dir():
            model = [mf.model_key(job.uid, rel) for rel in files_under(run_dir / MODEL)]
        # A planned market move (objectstore/moves.py): the last manifest hands the job over --
        # queued, its lease released -- for the machine `orch watch` launches on the new market.
        handing_over = job.state is JobState.MOVED and job.intent is Intent.MOVE
        manifest = mf.build_manifest(
            job,
            self.store.attempts(job.id),
            home_id=self.home_id,
            checkpoints=row["checkpoints"],
            batch=read_json(run_dir / BATCH),
            progress=read_json(run_dir / PROGRESS),
            result=result,
            model=model,
            data_files=data_files,
            provenance=provenance,
            released=released,
            now=now,
            machines=machines.current(
                row.get("machines") or [],
                self.home_id,
                now=now,
                progress=read_json(run_dir / PROGRESS),
                since=job.started_at or now,
            ),
            instance_id=self.instance_id(now),
        )
        if handing_over:
            manifest["state"] = JobState.QUEUED.value
        signing.sign(manifest, self.keys)
        key = mf.manifest_key(job.uid)
        try:
            etag = self.remote.cas_put(key, mf.dump(manifest), row.get("etag"))
        except Conflict:
            holder = self._holder(key, self._last_at.get(job.id))
            if holder is None:  # written by this home (an adopt here): take its ETag, try again next pass
                got = self.remote.get_with_etag(key)
                self.store.mirror_set(job.id, job.uid, etag=got[1] if got else None, dirty=1)
                return
            self._lost(job, holder, now)
            return
        final = int(job.state in TERMINAL)
        self.store.mirror_set(
            job.id,
            job.uid,
            etag=etag,
            manifest_at=now,
            dirty=0,
            final=final,
            released=int(released),
            error="",
            error_since=None,
            machines=manifest["machines"],
        )
        self._written[job.id] = self.fingerprint(job)
        self._last_at[job.id] = now
        for doomed in list(row.get("doomed") or []):
            self.remote.delete(doomed)  # the manifest that no longer names it is written
        if row.get("doomed"):
            self.store.mirror_set(job.id, job.uid, doomed=[])

    def _holder(self, key: str, ours_at: Optional[float] = None) -> Optional[str]:
        """Who took the job, when the manifest changed under our conditional write; None when no one
        did (written by this home, or a manifest that is not a real adoption: unsigned with a bucket
        key, or an older copy than the one we wrote -- a replay)."""
        got = self.remote.get_with_etag(key)
        if got is None:
            return None
        try:
            current = mf.parse_manifest(got[0], self.remote.where(key))
        except ValueError:
            return "an unreadable manifest"
        if self.keys is not None and signing.problem(current, self.keys):
            # Not written by a machine holding the bucket key: no one took the job; the next
            # pass writes over it (a forged manifest never stops a live job).
            log.warning(
                "mirror: job %s: its manifest in the bucket was replaced by one that is not signed with the "
                "bucket key (%s); writing ours over it",
                job_uid_of(current),
                signing.problem(current, self.keys),
            )
            return None
        own = current.get("owner") or {}
        if own.get("home_id") == self.home_id:
            return None
        written = current.get("written_at")
        if ours_at is not None and isinstance(written, (int, float)) and written < ours_at:
            log.warning(
                "mirror: job %s: an older copy of its manifest (written before ours) was put back in the "
                "bucket; writing ours over it",
                job_uid_of(current),
            )
            return None
        return f"{own.get('host') or '?'} ({own.get('by') or 'orch'} {own.get('pid') or ''})".strip()

    def _lost(self, job: Job, holder: str, now: float) -> None:
        reason = (
            f"adopted by {holder} through {self.remote.url.raw}: stopped here; this machine no longer writes its mirror"
        )
        log.warning("mirror: job %s: %s", job.id, reason)
        self.store.mirror_set(job.id, job.uid, lost=holder, dirty=0)
        for pending in self.store.uploads_pending(job.id):
            self.store.upload_finish(pending["id"], now, dropped="the job was adopted by another machine")
        self.on_lease_lost(job, reason)


def files_under(folder: Path) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            out.append(str((Path(root) / name).relative_to(folder)))
    return sorted(out)


def job_uid_of(manifest: dict[str, Any]) -> str:
    return str(manifest.get("uid") or "?")[:12]
