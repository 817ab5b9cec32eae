"""The files beside a job's checkpoints in its copy: progress, metrics, batch sizes and the
current log (throttled, only when changed), its input files (once, content-addressed) and, on
success, the result and the exported model."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional

from ...contract import BATCH, METRICS_CSV, MODEL, PROGRESS, PROVENANCE, PROVENANCE_FILES, RESULT, TRACKING, attempt_log
from ...contract import DIFF_PATCH, provenance_dir
from ...home.paths import Home
from ...model.records import Job
from ...objectstore import manifest as mf
from ...objectstore.remote import Remote
from ...redaction import environ_secrets, redact
from ...store import Store
from .lease import ACTIVE, files_under

log = logging.getLogger("orch.mirror")

_LOG_MAX_BYTES = 64 * 1024 * 1024  # a bigger log is not mirrored (its tail stays on the machine)


def outgoing_bytes(name: str, path: Path) -> bytes:
    """What of a run-folder file leaves the machine: the diff is masked with the one redaction rule
    first (an uncommitted file may hold a key; docs/security.md), the rest goes as it is."""
    data = path.read_bytes()
    if name == f"{PROVENANCE}/{DIFF_PATCH}":
        text = data.decode("utf-8", "surrogateescape")
        data = redact(text, environ_secrets(os.environ)).encode("utf-8", "surrogateescape")
    return data


class FileSync:
    def __init__(self, home: Home, store: Store, storage: Any, remote: Remote):
        self.home, self.store, self.s, self.remote = home, store, storage, remote
        self._files_seen: dict[tuple[int, str], tuple[float, int]] = {}
        self.inputs: dict[int, list[dict[str, Any]]] = {}  # job id -> its input files (objectstore/datafiles.py)
        self._hashes: dict[tuple[str, float, int], str] = {}

    def sync_files(self, job: Job, now: float, row: Optional[dict[str, Any]]) -> None:
        """progress.json, metrics.csv, batch.json, tracking.json and the current attempt's log, throttled and only
        when changed."""
        if (
            row is not None
            and row.get("files_at")
            and now - row["files_at"] < self.s.throttle_seconds
            and job.state in ACTIVE
        ):
            return
        run_dir = self.home.run_dir(job.id)
        names = [PROGRESS, METRICS_CSV, BATCH, TRACKING] + ([attempt_log(job.attempt)] if job.attempt else [])
        files = [(name, run_dir / name) for name in names]
        # What the job ran with travels too, so a machine that adopts it compares with the first one's.
        files += [(f"{PROVENANCE}/{name}", provenance_dir(run_dir) / name) for name in PROVENANCE_FILES]
        for name, path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            if st.st_size > _LOG_MAX_BYTES:
                continue
            seen = (st.st_mtime, st.st_size)
            if self._files_seen.get((job.id, name)) == seen:
                continue
            self.remote.put_bytes(mf.file_key(job.uid, name), outgoing_bytes(name, path))
            self._files_seen[(job.id, name)] = seen
        self.store.mirror_set(job.id, job.uid, files_at=now)

    def provenance_sent(self, job_id: int) -> list[str]:
        """The provenance files this process has uploaded for the job (the manifest names only those)."""
        return [n for n in PROVENANCE_FILES if (job_id, f"{PROVENANCE}/{n}") in self._files_seen]

    def sync_inputs(self, job: Job) -> None:
        """A built-in job's inputs, once per job in this process."""
        if job.kind == "builtin" and job.id not in self.inputs:
            self.inputs[job.id] = self.upload_inputs(job)

    def upload_inputs(self, job: Job) -> list[dict[str, Any]]:
        """The job's local data files and model folder, fingerprinted, and uploaded once
        (content-addressed) when their total is within [storage] data_max_mb."""
        from ...objectstore import datafiles

        entries = datafiles.collect(job.spec, int(self.s.data_max_mb * 1e6), self._hashes)
        sent = datafiles.upload(self.remote, entries)
        if entries:
            total = sum(e["bytes"] for e in entries) / 1e6
            travels = "uploaded" if entries[0].get("key") else "fingerprinted only (above data_max_mb)"
            log.info(
                "mirror: job %s: %d input file(s), %.1f MB, %s (%d new)", job.id, len(entries), total, travels, sent
            )
        return entries

    def upload_outputs(self, job: Job) -> None:
        run_dir = self.home.run_dir(job.id)
        if (run_dir / RESULT).exists():
            self.remote.put_bytes(mf.file_key(job.uid, RESULT), (run_dir / RESULT).read_bytes())
        folder = run_dir / MODEL
        if folder.is_dir():
            for rel in files_under(folder):
                self.remote.put_file(mf.model_key(job.uid, rel), folder / rel, concurrency=self.s.concurrency)
            log.info("mirror: job %s: result and model uploaded", job.id)
