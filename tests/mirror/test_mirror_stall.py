"""A store that hangs instead of refusing (issue 38, item 4): the S3 endpoint frozen (SIGSTOP: its
socket still accepts, nothing answers) while a job trains. The daemon must flag it as it flags a
refused one: a `mirror_failed` event, a warning in its log, `mirror lagging` in `orch status` and
`orch show`, the lag and the error in `show --json`; and catch up once the store answers again."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from daemon_harness import wait_for
from mirror_harness import ckpt_job, remote_for, storage_home, wait_manifest

pytestmark = pytest.mark.slow


def test_a_frozen_store_is_flagged_like_a_refused_one_and_the_mirror_catches_up(s3_env, homes, tmp_path):
    from s3_server import FreezableS3Server

    server = FreezableS3Server()
    try:
        h = storage_home(tmp_path / "a", f"s3://{server.bucket()}/orch", server.endpoint)
        homes.append(h)
        h.start_daemon()
        job_id = ckpt_job(h, "stalled", steps=3000, every=0.1, ckpt_every=3)
        uid = h.job(job_id).uid
        remote = remote_for(h)
        wait_manifest(remote, uid, lambda m: m["checkpoints"], what="a first mirrored checkpoint")
        server.freeze()
        try:
            wait_for(
                lambda: "mirror_failed" in [e.kind for e in h.store.events()],
                120,
                what="the mirror_failed event while the store hangs",
            )
            assert "mirror" in h.log_text() and "cannot reach" in h.log_text(), h.log_tail(20)
            status = h.cli("status")
            assert "mirror lagging" in status.stdout, status.stdout
            shown = h.cli("show", str(job_id))
            assert "mirror lagging" in shown.stdout, shown.stdout
            mirror = json.loads(h.cli("show", str(job_id), "--json").stdout)["mirror"]
            assert mirror["error"] and mirror["pending"] >= 1 and mirror["lag_s"] > 0, mirror
            assert h.job(job_id).state.value == "running"  # training went on
        finally:
            server.thaw()
        step_now = json.loads((h.run_dir(job_id) / "progress.json").read_text())["step"]
        wait_manifest(
            remote,
            uid,
            lambda m: m["checkpoints"][0]["step"] > step_now,
            timeout=120,
            what="uploads to catch up after the store answered again",
        )
        wait_for(lambda: "mirror_recovered" in [e.kind for e in h.store.events()], 60, what="mirror_recovered")
        assert [e.kind for e in h.store.events()].count("mirror_failed") == 1
    finally:
        server.stop()


def _mirror_with_a_checkpoint(tmp_path, endpoint: str, bucket: str, size: int):
    """A real Mirror (no daemon) on a real store, one queued job with one checkpoint to upload."""
    from orchestrator.daemon.mirror import Mirror
    from orchestrator.home.paths import Home
    from orchestrator.spec.config import Config, StorageSection
    from orchestrator.store import Store

    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    job = store.submit(
        name="stall",
        kind="command",
        gpus=0,
        priority=0,
        retries=0,
        spec={"command": ["true"]},
        spec_path="",
        now=time.time(),
    )
    folder = home.run_dir(job.id) / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "step-00000001.ckpt").write_bytes(os.urandom(size))
    events: list[tuple[str, str]] = []
    storage = StorageSection(url=f"s3://{bucket}/orch", endpoint=endpoint, part_size_mb=8)
    mirror = Mirror(
        home, Config(storage=storage), store, on_event=lambda kind, detail: events.append((kind.value, detail))
    )
    mirror.scan(job, time.time())
    return mirror, store, events


def test_an_upload_the_frozen_store_holds_is_flagged_by_the_stall_watch(s3_env, tmp_path):
    from s3_server import FreezableS3Server

    server = FreezableS3Server()
    try:
        mirror, store, events = _mirror_with_a_checkpoint(tmp_path, server.endpoint, server.bucket(), 64 * 1024)
        server.freeze()
        uploading = threading.Thread(target=mirror.upload_pending, daemon=True)
        uploading.start()
        wait_for(lambda: mirror.uploads.in_flight(), 30, what="the upload to start")
        flagged = wait_for(
            lambda: mirror.stall_watch.check(time.monotonic()), 120, what="the stall watch to flag the frozen store"
        )
        assert flagged and [kind for kind, _ in events] == ["mirror_failed"], events
        assert "no answer from the store while uploading step-00000001.ckpt" in events[0][1]
        server.thaw()
        uploading.join(120)
        assert not uploading.is_alive() and not store.uploads_pending()  # the held upload went through
    finally:
        server.stop()


def test_a_slow_link_upload_longer_than_the_read_timeout_is_neither_cut_nor_flagged(s3_env, s3_server, tmp_path):
    from s3_server import ThrottledProxy

    from orchestrator.objectstore.stall import READ_TIMEOUT_S

    proxy = ThrottledProxy(s3_server.endpoint, rate=256 * 1024)
    try:
        size = int(256 * 1024 * READ_TIMEOUT_S * 1.5)  # one request that sends for ~15 s, reading nothing
        mirror, store, events = _mirror_with_a_checkpoint(tmp_path, proxy.endpoint, s3_server.bucket(), size)
        uploading = threading.Thread(target=mirror.upload_pending, daemon=True)
        uploading.start()
        while uploading.is_alive():
            assert not mirror.stall_watch.check(time.monotonic()), events  # the store answers the probe
            uploading.join(0.5)
        assert not store.uploads_pending() and not events
        assert store.mirror_state(1)["checkpoints"][0]["bytes"] == size
    finally:
        proxy.stop()
