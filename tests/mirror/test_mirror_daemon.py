"""The daemon's uploader with fast command jobs against the loopback S3 server and file://."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from daemon_harness import kill_leftover_attempts, wait_for
from mirror_harness import ckpt_job, manifest, named_keys, remote_for, storage_home, wait_manifest

from orchestrator.states import JobState

pytestmark = pytest.mark.slow


@pytest.fixture(params=["s3", "file"])
def store_url(request, s3_server, s3_env, tmp_path: Path):
    if request.param == "s3":
        return f"s3://{s3_server.bucket()}/orch", s3_server.endpoint
    return f"file://{tmp_path}/mirror", None


@pytest.fixture
def homes():
    made = []
    yield made
    for h in made:
        h.cleanup()


def test_manifest_names_only_uploaded_checkpoints_and_retention_never_deletes_a_named_one(store_url, homes, tmp_path):
    url, endpoint = store_url
    h = storage_home(tmp_path / "a", url, endpoint)
    homes.append(h)
    h.start_daemon()
    job_id = ckpt_job(h, "ret", steps=8, every=0.25)
    uid = h.job(job_id).uid
    remote = remote_for(h)
    seen_steps = set()
    deadline = time.monotonic() + 40
    while h.state(job_id) is not JobState.SUCCEEDED or not (manifest(remote, uid) or {}).get("state") == "succeeded":
        m = manifest(remote, uid)
        if m is not None:
            for key in named_keys(m):  # every checkpoint the manifest names exists, at every moment
                assert remote.exists(key), f"{key} named by the manifest but missing"
            seen_steps |= {c["step"] for c in m["checkpoints"]}
            assert len(m["checkpoints"]) <= 2
        assert time.monotonic() < deadline, h.log_tail()
        time.sleep(0.05)
    m = manifest(remote, uid)
    steps = [c["step"] for c in m["checkpoints"]]
    assert steps[0] == 8 and len(steps) == 2 and steps[1] < 8, steps  # newest wins: older ones may be skipped
    stored = {meta["path"] for meta in remote.list(f"jobs/{uid}/checkpoints")}
    assert stored == set(named_keys(m)), "retention deletes the checkpoints the manifest no longer names"
    assert len(seen_steps | set(steps)) >= 3, seen_steps  # so retention did delete some
    assert m["owner"]["released"] is True and m["attempts"][0]["outcome"] == "succeeded"
    show = json.loads(h.cli("show", str(job_id), "--json").stdout)
    assert show["mirror"]["step"] == 8 and show["mirror"]["pending"] == 0 and show["mirror"]["error"] is None
