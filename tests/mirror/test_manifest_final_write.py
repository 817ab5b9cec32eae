"""A manifest whose state is terminal is released in the same write (docs/mirror.md, "What a
reader of a manifest may rely on"): a checkpoint's commit that races the job's end must not write
`succeeded` with the lease still held, nor mark that write the final one."""

from __future__ import annotations

import time
from pathlib import Path

from mirror_harness import manifest, remote_for, storage_home

from orchestrator.daemon.mirror.lease import ManifestWriter
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState


def test_a_job_that_ends_under_a_commit_gets_no_unreleased_terminal_manifest(tmp_path: Path):
    h = storage_home(tmp_path / "a", f"file://{tmp_path}/mirror")
    try:
        job_id = h.submit("m", hold="never")
        now = time.time()
        running = h.store.transition(job_id, JobState.RUNNING, EventKind.STARTED, now, begin_attempt=AttemptStart(1))
        writer = ManifestWriter(h.home, h.store, remote_for(h), "home-a", lambda job, holder: None)
        writer.write(running, None, now)  # the running job's manifest, as a heartbeat writes it
        assert manifest(remote_for(h), running.uid)["owner"]["released"] is False

        # The reap records the success; the uploader thread still holds the job as it read it,
        # running, and commits a checkpoint with it (what `_commit` does).
        h.store.transition(
            job_id,
            JobState.SUCCEEDED,
            EventKind.SUCCEEDED,
            now + 1,
            end_attempt=AttemptEnd(ended_at=now + 1, outcome=AttemptOutcome.SUCCEEDED, exit_code=0),
        )
        writer.write(running, h.store.mirror_state(job_id), now + 1)
        m = manifest(remote_for(h), running.uid)
        assert not (m["state"] == "succeeded" and m["owner"]["released"] is False), m["owner"]
        assert not h.store.mirror_state(job_id)["final"]  # so the final write is still to come

        # sync_job's final write: terminal and released together.
        writer.write(h.store.get(job_id), h.store.mirror_state(job_id), now + 2, released=True)
        m = manifest(remote_for(h), running.uid)
        assert m["state"] == "succeeded" and m["owner"]["released"] is True
        assert h.store.mirror_state(job_id)["final"]
    finally:
        h.cleanup()
