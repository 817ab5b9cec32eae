"""ORCH_HOME is private: a home another user owns or that group/others may write is refused with
the fix in the message; an existing 0755 home is tightened to 0700; a link planted where a run
folder belongs is never followed (the job's spec, [env] secrets included, would be written
through it); the file:// store's lock files are opened without following links."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from daemon_harness import orch_home  # noqa: F401  (fixture)
from orchestrator.spec.config import StorageSection
from orchestrator.model.states import JobState
from orchestrator.objectstore.remote import LOCKS, Remote, StorageError

JOB = f'gpus = 0\ncommand = {json.dumps([sys.executable, "-c", "pass"])}\n[env]\nHF_TOKEN = "hf_secret"\n'


def test_a_home_others_may_write_is_refused_with_the_fix(sandbox):
    sandbox.home.mkdir()
    os.chmod(sandbox.home, 0o777)
    sandbox.mark()
    ran = sandbox.orch("status").clean(2)
    assert str(sandbox.home) in ran.err and f"chmod 700 {sandbox.home}" in ran.err, ran.err
    assert os.listdir(sandbox.home) == []
    sandbox.assert_nothing_outside_home()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_home_owned_by_another_user_is_refused(sandbox):
    sandbox.home.mkdir(mode=0o700)
    os.chown(sandbox.home, 4242, 4242)
    ran = sandbox.orch("status").clean(2)
    assert "belongs to user id 4242" in ran.err and "chown" in ran.err, ran.err
    assert os.listdir(sandbox.home) == []


def test_an_existing_0755_home_is_tightened_to_0700(sandbox):
    sandbox.home.mkdir()
    os.chmod(sandbox.home, 0o755)
    sandbox.orch("status").clean(0)
    assert stat.S_IMODE(os.stat(sandbox.home).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(sandbox.home / "runs").st_mode) == 0o700


def test_runs_may_link_to_a_private_folder_on_another_disk_but_not_to_one_others_may_write(sandbox):
    sandbox.home.mkdir(mode=0o700)
    disk = sandbox.root / "data-disk"
    disk.mkdir(mode=0o700)
    os.symlink(disk, sandbox.home / "runs")
    job = sandbox.root / "job.toml"
    job.write_text(JOB)
    sandbox.orch("submit", job).clean(0)
    assert (disk / "1" / "job.toml").is_file()  # the run folder lives on the linked disk
    os.chmod(disk, 0o777)
    ran = sandbox.orch("status").clean(2)
    assert str(disk) in ran.err and "chmod 700" in ran.err, ran.err


def test_submit_never_writes_through_a_link_planted_at_the_run_folder(sandbox):
    sandbox.orch("status").clean(0)
    target = sandbox.root / "attacker"
    target.mkdir()
    os.symlink(target, sandbox.home / "runs" / "1")
    job = sandbox.root / "job.toml"
    job.write_text(JOB)
    sandbox.mark()
    ran = sandbox.orch("submit", job).clean(2)
    assert "runs/1" in ran.err and "link" in ran.err, ran.err
    assert os.listdir(target) == []  # the spec and its secret went nowhere
    shown = sandbox.orch("status", "--all", "--json").clean(0)
    assert [j["state"] for j in json.loads(shown.out)] == ["failed"], shown.out
    sandbox.assert_nothing_outside_home()


@pytest.mark.slow
def test_the_daemon_never_follows_a_link_planted_at_a_run_folder(orch_home, tmp_path):
    h = orch_home(cpu_slots=1)
    victim = h.submit("victim", priority=5)
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    run_dir = h.run_dir(victim)
    for p in run_dir.iterdir():
        p.unlink()
    run_dir.rmdir()
    os.symlink(attacker, run_dir)
    good = h.submit("behind")
    daemon = h.start_daemon()
    h.wait_state(good, JobState.SUCCEEDED, timeout=60)
    failed = h.wait_state(victim, JobState.FAILED, timeout=30)
    assert "link" in failed.reason, failed.reason
    assert os.listdir(attacker) == []
    h.stop_daemon(daemon)


def test_the_file_store_lock_is_never_opened_through_a_link(tmp_path):
    store_dir, outside = tmp_path / "store", tmp_path / "outside.txt"
    remote = Remote(StorageSection(url=f"file://{store_dir}"))
    remote.put_bytes("jobs/x/manifest.json", b"{}")
    import hashlib

    locks = store_dir / LOCKS
    locks.mkdir(exist_ok=True)
    name = hashlib.sha256(b"jobs/x/manifest.json").hexdigest()[:32] + ".lock"
    os.symlink(outside, locks / name)
    with pytest.raises(StorageError, match="link"):
        remote.cas_put("jobs/x/manifest.json", b'{"new": 1}', None)
    assert not outside.exists()
