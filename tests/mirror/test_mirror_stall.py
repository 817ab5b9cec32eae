"""A store that hangs instead of refusing (issue 38, item 4): the S3 endpoint frozen (SIGSTOP: its
socket still accepts, nothing answers) while a job trains. The daemon must flag it as it flags a
refused one: a `mirror_failed` event, a warning in its log, `mirror lagging` in `orch status` and
`orch show`, the lag and the error in `show --json`; and catch up once the store answers again."""

from __future__ import annotations

import json

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
