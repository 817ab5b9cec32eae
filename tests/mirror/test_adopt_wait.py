"""An adoption that must wait for the lease holder, with a real file:// bucket, real `orch` processes
and a real store: `orch adopt --wait` waits while another machine holds the job and adopts it once
the holder releases it; a one-shot `orch adopt` refused because the holder is the machine a planned
move takes the job from leaves a pending adoption (exit 0), which the daemon's step completes at
the hand-over; refused for any other holder, it is refused (exit 1), nothing left pending."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomli_w
from daemon_harness import wait_for
from recovery_harness import env

from orchestrator.adopt.pending import pending
from orchestrator.adopt.pending_run import complete_pending
from orchestrator.home.paths import Home
from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.spec.config import StorageSection, load_config
from orchestrator.store import Store


def orch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )


def launched_job(tmp_path: Path) -> tuple[str, str, Remote]:
    url = f"file://{tmp_path}/bucket"
    (tmp_path / "bucket").mkdir()
    (tmp_path / "job.toml").write_text(tomli_w.dumps({"name": "w", "gpus": 0, "command": ["true"]}))
    (tmp_path / "ctl").mkdir()
    (tmp_path / "ctl" / "config.toml").write_text(tomli_w.dumps({"storage": {"url": url}}))
    done = orch(tmp_path / "ctl", "launch", str(tmp_path / "job.toml"), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return url, str(json.loads(done.stdout)["uid"]), Remote(StorageSection(url=url))


def hold(remote: Remote, uid: str, home: str, *, released: bool = False) -> None:
    got = remote.get_with_etag(mf.manifest_key(uid))
    assert got is not None
    m: dict[str, Any] = json.loads(got[0])
    m["owner"] = {"host": "old-vm", "home_id": home, "pid": 1, "heartbeat": time.time(), "released": released}
    remote.cas_put(mf.manifest_key(uid), mf.dump(m), got[1])


def machine(tmp_path: Path, url: str, name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    (root / "config.toml").write_text(tomli_w.dumps({"storage": {"url": url}}))
    return root


def test_adopt_wait_waits_for_the_holder_then_adopts(tmp_path):
    url, uid, remote = launched_job(tmp_path)
    hold(remote, uid, "home-old")
    root = machine(tmp_path, url, "new")
    out = tmp_path / "adopt.err"
    with open(out, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "--home",
                str(root),
                "adopt",
                url,
                "--job",
                uid,
                "--yes",
                "--wait",
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env(),
        )
        try:
            wait_for(
                lambda: "waiting for 1 job(s) held by another machine" in out.read_text(),
                60,
                what=lambda: out.read_text(),
            )
            assert proc.poll() is None
            hold(remote, uid, "home-old", released=True)  # the holder's clean stop
            stdout, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, stdout + out.read_text()
    assert f"adopted {uid[:12]} (w)" in stdout


def test_a_one_shot_adopt_held_for_a_planned_move_is_left_pending_and_completed_at_the_hand_over(tmp_path):
    url, uid, remote = launched_job(tmp_path)
    hold(remote, uid, "home-od")
    claim = cl.Claim(uid, 2, cl.LAUNCHED, "spot", {"home_id": "home-od"}, time.time(), "ctl", time.time())
    claim.extra["move_for"] = "home-od"  # the controller launched this machine to take the job from home-od
    cl.put_new(remote, claim)
    root = machine(tmp_path, url, "spot")

    done = orch(root, "adopt", url, "--job", uid, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"pending: job {uid[:12]} (w) is held by the machine a planned move to spot (launch 2) takes it from"
        in done.stdout
    )
    home = Home(root)
    assert [p["uid"] for p in pending(home)] == [uid]

    config = load_config(root / "config.toml", required=True)
    store = Store(home.db)
    try:
        assert complete_pending(home, config, store) == 0  # still held: it waits
        assert [p["uid"] for p in pending(home)] == [uid]
        hold(remote, uid, "home-od", released=True)  # the hand-over
        assert complete_pending(home, config, store) == 1
        job = store.by_uid(uid)
        assert job is not None and job.state.value == "queued"
        assert pending(home) == []
    finally:
        store.close()


def test_a_one_shot_adopt_held_by_another_machine_is_refused_and_nothing_is_left_pending(tmp_path):
    url, uid, remote = launched_job(tmp_path)
    hold(remote, uid, "home-someone")  # no planned move names it
    root = machine(tmp_path, url, "other")
    done = orch(root, "adopt", url, "--job", uid, "--yes")
    assert done.returncode == 1 and "still owned by host old-vm" in done.stderr and "--wait" in done.stderr
    assert pending(Home(root)) == []
