"""The daemon's uploader with fast command jobs against the loopback S3 server and file://."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from daemon_harness import kill_leftover_attempts, wait_for
from mirror_harness import ckpt_job, manifest, named_keys, remote_for, storage_home, wait_manifest
from s3_server import ThrottledProxy

from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


@pytest.fixture(params=["s3", "file"])
def store_url(request, s3_server, s3_env, tmp_path: Path):
    if request.param == "s3":
        return f"s3://{s3_server.bucket()}/orch", s3_server.endpoint
    return f"file://{tmp_path}/mirror", None


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
            # a terminal manifest is released in the same write (docs/mirror.md): the first
            # "succeeded" this loop sees is the final write, read below
            assert m["state"] != "succeeded" or m["owner"]["released"] is True, m["owner"]
            for key in named_keys(m):  # every checkpoint the current manifest names exists, at every moment
                if not remote.exists(key):  # fine only if a newer manifest stopped naming it meanwhile
                    assert key not in named_keys(manifest(remote, uid)), f"{key} named by the manifest but missing"
            seen_steps |= {c["step"] for c in m["checkpoints"]}
            assert len(m["checkpoints"]) <= 2
        assert time.monotonic() < deadline, h.log_tail()
        time.sleep(0.05)
    m = manifest(remote, uid)
    steps = [c["step"] for c in m["checkpoints"]]
    assert steps[0] == 8 and len(steps) == 2 and steps[1] < 8, steps  # newest wins: older ones may be skipped
    # retention deletes what the manifest no longer names, right after writing it
    wait_for(
        lambda: {meta["path"] for meta in remote.list(f"jobs/{uid}/checkpoints")} == set(named_keys(m)),
        10,
        what="retention to delete the checkpoints the manifest no longer names",
    )
    assert len(seen_steps | set(steps)) >= 3, seen_steps  # so retention did delete some
    assert m["owner"]["released"] is True and m["attempts"][0]["outcome"] == "succeeded"
    show = json.loads(h.cli("show", str(job_id), "--json").stdout)
    assert show["mirror"]["step"] == 8 and show["mirror"]["pending"] == 0 and show["mirror"]["error"] is None
    text = h.cli("show", str(job_id)).stdout
    assert f"mirror:    {url}   step 8   pending 0" in text, text


def _kill_home(h) -> None:
    """SIGKILL every orch process of a home: its daemons, supervisors and jobs (the machine is gone)."""
    for proc in h.daemons:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    kill_leftover_attempts(h.home)


def test_adopt_refuses_a_live_owner_two_machines_cannot_both_adopt_and_the_old_owner_cannot_write(
    store_url, homes, tmp_path
):
    url, endpoint = store_url
    a = storage_home(tmp_path / "a", url, endpoint, stale_after_minutes=0.1)
    homes.append(a)
    a.start_daemon()
    job_id = ckpt_job(a, "lease", steps=400, every=0.1, ckpt_every=5)
    uid = a.job(job_id).uid
    remote = remote_for(a)
    wait_manifest(remote, uid, lambda m: m["checkpoints"] and m["state"] == "running")

    b = storage_home(tmp_path / "b", url, endpoint, stale_after_minutes=0.1)
    homes.append(b)
    refused = b.cli("adopt", "--yes", url, "--all")
    assert refused.returncode == 1 and "still owned by host" in refused.stderr and "heartbeat is" in refused.stderr, (
        refused
    )
    assert b.store.by_uid(uid) is None

    _kill_home(a)  # the machine is lost; its heartbeat goes stale after 6 s
    adopted = wait_for(
        lambda: (lambda r: r if r.returncode == 0 else None)(b.cli("adopt", "--yes", url, "--all")),
        30,
        interval=0.5,
        what="adoption once the lease is stale",
    )
    assert "adopted" in adopted.stdout and "sha256 verified" in adopted.stdout, adopted
    job_b = b.store.by_uid(uid)
    assert job_b.state is JobState.QUEUED and job_b.attempt == 1
    attempts = b.store.attempts(job_b.id)
    assert attempts[-1].outcome == "lost" and attempts[-1].step_reached >= 5
    assert manifest(remote, uid)["owner"]["home_id"] == (b.root / "mirror-id").read_text().strip()

    c = storage_home(tmp_path / "c", url, endpoint, stale_after_minutes=0.1)
    homes.append(c)
    second = c.cli("adopt", "--yes", url, "--job", uid[:8])
    assert second.returncode == 1 and "still owned by host" in second.stderr, second

    # The old owner comes back (its disk survived): it must not overwrite the manifest.
    before = manifest(remote, uid)
    a.start_daemon()
    wait_for(lambda: "lease_lost" in a.event_kinds(job_id), 20, what=f"A to see it lost the lease: {a.log_tail()}")
    a.wait_state(job_id, JobState.MOVED, timeout=30)
    shown = json.loads(a.cli("show", str(job_id), "--json").stdout)
    assert shown["state"] == "moved" and "adopted by" in shown["reason"], shown
    retried = a.cli("retry", str(job_id))  # it runs on B now: running it here too would train it twice
    assert retried.returncode == 1 and "runs there now" in retried.stderr, retried
    a.wait_ticks(1, mirror=3)  # three more passes of A's uploader, each a heartbeat's chance: A stays silent
    after = manifest(remote, uid)
    assert after["owner"] == before["owner"], "the old owner overwrote the manifest"


def test_corrupt_newest_checkpoint_is_rejected_by_name_and_adoption_falls_back(store_url, homes, tmp_path):
    url, endpoint = store_url
    a = storage_home(tmp_path / "a", url, endpoint, keep=3)
    homes.append(a)
    a.start_daemon()
    job_id = ckpt_job(a, "corrupt", steps=400, every=0.1, ckpt_every=4)
    uid = a.job(job_id).uid
    remote = remote_for(a)
    m = wait_manifest(remote, uid, lambda m: len(m["checkpoints"]) >= 2, what="two mirrored checkpoints")
    a.cli("daemon", "stop")  # a clean stop: checkpoints, mirrors, releases the lease
    for proc in a.daemons:
        proc.wait(30)
    m = wait_manifest(remote, uid, lambda m: m["owner"]["released"], what="the lease released")
    newest, older = m["checkpoints"][0], m["checkpoints"][1]
    remote.put_bytes(newest["key"], b"not a checkpoint")  # bit rot, a bad copy, a tampered object

    b = storage_home(tmp_path / "b", url, endpoint)
    homes.append(b)
    ran = b.cli("adopt", "--yes", url, "--job", uid)  # released: no wait for staleness
    assert ran.returncode == 0, ran
    assert f"rejected {remote.where(newest['key'])}" in ran.stderr, ran.stderr
    assert f"resuming from step {older['step']}" in ran.stdout, ran.stdout
    job_b = b.store.by_uid(uid)
    ckpts = sorted(p.name for p in (b.run_dir(job_b.id) / "checkpoints").iterdir())
    assert ckpts == [older["name"]], ckpts
    assert any("rejected" in e.detail for e in b.store.events(job_b.id))


def test_storage_down_never_pauses_training_one_warning_then_uploads_catch_up(s3_env, homes, tmp_path):
    from s3_server import S3Server  # a server of its own: this test stops it
    from moto.server import ThreadedMotoServer

    server = S3Server()
    port = int(server.endpoint.rsplit(":", 1)[1])
    bucket = server.bucket()
    url = f"s3://{bucket}/orch"
    h = storage_home(tmp_path / "a", url, server.endpoint)
    homes.append(h)
    h.start_daemon()
    job_id = ckpt_job(h, "down", steps=400, every=0.1, ckpt_every=3)
    uid = h.job(job_id).uid
    remote = remote_for(h)
    wait_manifest(remote, uid, lambda m: m["checkpoints"], what="a first mirrored checkpoint")
    server.stop()
    try:
        wait_for(lambda: "mirror_failed" in [e.kind for e in h.store.events()], 60, what="the mirror_failed event")
        status = h.cli("status")
        assert "mirror lagging" in status.stdout, status.stdout
        show = json.loads(h.cli("show", str(job_id), "--json").stdout)
        assert show["mirror"]["error"], show["mirror"]

        def step() -> int:
            return json.loads((h.run_dir(job_id) / "progress.json").read_text())["step"]

        # The job goes on stepping and saving (a checkpoint every 3 steps) while every upload fails:
        # 30 more steps, ten saves, with the bucket down the whole time.
        failing_since = step()
        wait_for(lambda: step() >= failing_since + 30, 120, what="the job stepping on while the bucket is down")
        step_now = step()
    finally:
        server.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.server.start()
    wait_manifest(
        remote,
        uid,
        lambda m: m["checkpoints"][0]["step"] > step_now,
        timeout=60,
        what="uploads to catch up after the store came back",
    )
    wait_for(lambda: "mirror_recovered" in [e.kind for e in h.store.events()], 30, what="mirror_recovered")
    assert [e.kind for e in h.store.events()].count("mirror_failed") == 1
    h.cleanup()
    homes.remove(h)
    server.stop()


def test_sigkill_in_the_middle_of_an_upload_leaves_the_manifest_on_complete_checkpoints(
    s3_server, s3_env, homes, tmp_path
):
    url, endpoint = f"s3://{s3_server.bucket()}/orch", s3_server.endpoint
    # A slow uplink (8 MiB/s: the 160 MiB checkpoint takes 20 s), so the kill provably lands inside
    # the put, seen by the bytes the proxy passed, whatever the machine's speed.
    proxy = ThrottledProxy(endpoint, rate=8 * 1024 * 1024)
    a = storage_home(tmp_path / "a", url, proxy.endpoint, concurrency=1)
    homes.append(a)
    a.start_daemon()
    job_id = ckpt_job(
        a,
        "midway",
        steps=4,
        every=0.3,
        ckpt_every=2,
        big_from=4,
        big=160 * 1024 * 1024,
        release=str(tmp_path / "never"),
    )
    uid = a.job(job_id).uid
    remote = remote_for(a)
    wait_manifest(remote, uid, lambda m: m["checkpoints"] and m["checkpoints"][0]["step"] == 2, what="step 2 mirrored")
    wait_for(
        lambda: "queued step-00000004.ckpt" in a.home.log_file.read_text(),
        30,
        interval=0.02,
        what="the big upload to start",
    )
    under_way = proxy.passed
    wait_for(lambda: proxy.passed > under_way + 4 * 1024 * 1024, 60, what="4 MiB of the big checkpoint sent")
    assert "uploaded step-00000004.ckpt" not in a.home.log_file.read_text(), "the upload finished too fast to test"
    _kill_home(a)
    m = manifest(remote, uid)
    assert [c["step"] for c in m["checkpoints"]] == [2], m["checkpoints"]
    assert not any("step-00000004" in meta["path"] for meta in remote.list(f"jobs/{uid}")), (
        "a partial object is visible"
    )

    b = storage_home(tmp_path / "b", url, endpoint)
    homes.append(b)
    ran = wait_for(
        lambda: (lambda r: r if r.returncode == 0 else None)(b.cli("adopt", "--yes", url, "--all")),
        30,
        interval=0.5,
        what="adoption once the lease is stale",
    )
    assert "resuming from step 2" in ran.stdout, ran
    job_b = b.store.by_uid(uid)
    # The step the lost attempt reached is the newest the mirror heard of: at least the 2 mirrored, at
    # most the 4 it trained. Progress is synced after the checkpoint's upload has started (the put
    # goes first, within 0.1 s of the file appearing), so it may still say 2 when the kill comes.
    assert 2 <= b.store.attempts(job_b.id)[-1].step_reached <= 4
    proxy.stop()


def test_daemon_stop_drops_the_periodic_upload_in_flight_mirrors_the_notice_checkpoint_and_releases(
    s3_server, s3_env, homes, tmp_path
):
    url, endpoint = f"s3://{s3_server.bucket()}/orch", s3_server.endpoint
    a = storage_home(tmp_path / "a", url, endpoint, concurrency=1)
    homes.append(a)
    a.start_daemon()
    job_id = ckpt_job(
        a, "notice", steps=400, every=0.1, ckpt_every=5, big_from=10, big=160 * 1024 * 1024, notice_size=64 * 1024
    )
    uid = a.job(job_id).uid
    remote = remote_for(a)
    wait_for(
        lambda: "queued step-00000010.ckpt" in a.home.log_file.read_text(),
        30,
        interval=0.02,
        what="the big periodic upload to start",
    )
    a.daemons[0].send_signal(signal.SIGTERM)
    assert a.daemons[0].wait(300) == 0
    log = a.home.log_file.read_text()
    m = manifest(remote, uid)
    assert m["checkpoints"][0]["notice"] and m["owner"]["released"] and m["state"] == "queued", m["checkpoints"]
    assert "dropped for a notice checkpoint" in log or "gives way to a notice checkpoint" in log, log
    assert "uploaded step-00000010.ckpt" not in log, "the big periodic upload went before the notice checkpoint"
    assert "unfinished after notice_deadline_seconds" not in log, log  # the daemon's own word: in time


def test_missing_the_notice_deadline_leaves_the_manifest_at_the_previous_checkpoint_and_counts_the_steps_as_lost(
    s3_server, s3_env, homes, tmp_path
):
    url, endpoint = f"s3://{s3_server.bucket()}/orch", s3_server.endpoint
    a = storage_home(tmp_path / "a", url, endpoint, concurrency=1, notice_concurrency=1, notice_deadline_seconds=1.0)
    homes.append(a)
    a.start_daemon()
    job_id = ckpt_job(a, "late", steps=60, every=0.1, ckpt_every=5, notice_size=160 * 1024 * 1024)
    uid = a.job(job_id).uid
    remote = remote_for(a)
    wait_manifest(
        remote, uid, lambda m: m["checkpoints"] and m["checkpoints"][0]["step"] >= 10, what="step 10 mirrored"
    )
    mirrored = manifest(remote, uid)["checkpoints"][0]["step"]
    # the job past the mirrored checkpoint, so the notice checkpoint holds steps the mirror lacks
    wait_for(
        lambda: json.loads((a.run_dir(job_id) / "progress.json").read_text())["step"] > mirrored,
        30,
        what="the job past the mirrored step",
    )
    a.daemons[0].send_signal(signal.SIGTERM)
    assert a.daemons[0].wait(60) == 0
    notice = sorted((a.run_dir(job_id) / "checkpoints").glob("notice-*"))[-1]
    notice_step = int(notice.stem.rsplit("-", 1)[1])
    m = manifest(remote, uid)
    prev = m["checkpoints"][0]["step"]
    assert not m["checkpoints"][0]["notice"] and prev < notice_step, (m["checkpoints"], notice_step)
    assert m["owner"]["released"], "a clean stop releases the lease even when an upload missed the deadline"
    assert "unfinished after notice_deadline_seconds" in a.home.log_file.read_text()

    b = storage_home(tmp_path / "b", url, endpoint)
    homes.append(b)
    ran = b.cli("adopt", "--yes", url, "--all")  # released: no waiting for the heartbeat to go stale
    assert ran.returncode == 0 and f"resuming from step {prev}" in ran.stdout, ran
    job_b = b.store.by_uid(uid)
    b.start_daemon()
    b.wait_state(job_b.id, JobState.SUCCEEDED, timeout=30)
    assert b.job(job_b.id).steps_lost == notice_step - prev > 0


def test_a_daemon_killed_mid_upload_sends_the_checkpoint_again_on_restart_and_leaves_no_stray_object(
    s3_server, s3_env, homes, tmp_path
):
    """The upload queue survives a SIGKILL of the daemon: the next daemon on the same home sends the
    checkpoint again (under the same key), the manifest records the sha256 of the bytes stored, and
    the store holds exactly the checkpoints the manifest names."""
    import hashlib

    url, endpoint = f"s3://{s3_server.bucket()}/orch", s3_server.endpoint
    a = storage_home(tmp_path / "a", url, endpoint, concurrency=1)
    homes.append(a)
    a.start_daemon()
    release = tmp_path / "release"
    job_id = ckpt_job(
        a, "again", steps=4, every=0.3, ckpt_every=2, big_from=4, big=160 * 1024 * 1024, release=str(release)
    )
    uid = a.job(job_id).uid
    remote = remote_for(a)
    wait_manifest(remote, uid, lambda m: m["checkpoints"] and m["checkpoints"][0]["step"] == 2, what="step 2 mirrored")
    wait_for(
        lambda: "queued step-00000004.ckpt" in a.home.log_file.read_text(),
        30,
        interval=0.02,
        what="the big upload to start",
    )
    a.kill9(a.daemons[0])  # the daemon only: the job goes on and is adopted by the next daemon
    if "uploaded step-00000004.ckpt" in a.home.log_file.read_text():
        pytest.skip("the upload finished before the kill: nothing to test on this machine")
    assert [c["step"] for c in manifest(remote, uid)["checkpoints"]] == [2]
    a.start_daemon()
    m = wait_manifest(remote, uid, lambda m: m["checkpoints"][0]["step"] == 4, timeout=120, what="step 4 mirrored")
    release.write_text("")
    a.wait_state(job_id, JobState.SUCCEEDED, timeout=60)
    m = wait_manifest(remote, uid, lambda m: m["state"] == "succeeded", what="the last manifest")
    newest = m["checkpoints"][0]
    local = a.run_dir(job_id) / "checkpoints" / "step-00000004.ckpt"
    assert (
        newest["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest() and newest["bytes"] == local.stat().st_size
    )
    assert remote.download(newest["key"], tmp_path / "back.ckpt") == (newest["sha256"], newest["bytes"])
    wait_for(
        lambda: {meta["path"] for meta in remote.list(f"jobs/{uid}/checkpoints")} == set(named_keys(m)),
        10,
        what="the store to hold exactly the named checkpoints",
    )
    assert a.home.log_file.read_text().count("queued step-00000004.ckpt") == 1, "queued again instead of resumed"
