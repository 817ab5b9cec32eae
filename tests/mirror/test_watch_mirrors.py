"""`orch watch --once` as a new user runs it (issue 38, items 6 and 11): a file:// mirror folder
that does not exist is refused (exit 2, naming it) instead of being made and reported empty; jobs
this home remembers from another mirror are never shown as this one's; and the controller's
notification titles name the job. The real `orch` command, a real file:// mirror with a job whose
machine went silent, the controller's real outbox."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import tomli_w
from bucket_key import KEY_ENV, signed

from notifiers import Message
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.spec.config import StorageSection
from orchestrator.store import Store

UID = "fedcba9876543210fedcba9876543210"


def _mirror_with_a_lost_machine(folder: Path) -> str:
    url = f"file://{folder}"
    remote = Remote(StorageSection(url=url))
    manifest = {
        "version": 1,
        "uid": UID,
        "name": "bert-sst2",
        "state": "running",
        "gpus": 1,
        "spec": {"name": "bert-sst2", "command": ["true"]},
        "owner": {"host": "old-vm", "home_id": "home-old", "pid": 1, "by": "daemon", "heartbeat": time.time() - 600},
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "budget": {},
    }
    remote.cas_put(mf.manifest_key(UID), mf.dump(signed(manifest)), None)
    return url


def _controller_home(tmp: Path, url: str) -> Path:
    root = tmp / "controller"
    root.mkdir()
    config = {
        "storage": {"url": url, "stale_after_minutes": 1.0, "signing_key_env": KEY_ENV},
        "recovery": {"provider": "command", "launch": ["true"], "poll_seconds": 10.0},
        "notifiers": [{"type": "webhook", "url": "http://127.0.0.1:9/hook", "events": ["machine_lost"]}],
    }
    (root / "config.toml").write_text(tomli_w.dumps(config))
    return root


def _watch_once(root: Path, *url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(root), "watch", "--once", *url],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_watch_refuses_a_file_mirror_folder_that_does_not_exist(tmp_path: Path):
    root = _controller_home(tmp_path, _mirror_with_a_lost_machine(tmp_path / "real-mirror"))
    missing = tmp_path / "typo-mirror"
    ran = _watch_once(root, f"file://{missing}")
    assert ran.returncode == 2, ran
    assert str(missing) in ran.stderr and "does not exist" in ran.stderr and "Traceback" not in ran.stderr
    assert not missing.exists()  # never made: the next look would call it an empty mirror


def test_watch_never_shows_another_mirrors_jobs_and_its_titles_name_the_job(tmp_path: Path):
    real = _mirror_with_a_lost_machine(tmp_path / "real-mirror")
    root = _controller_home(tmp_path, real)
    first = _watch_once(root)
    assert first.returncode == 0, first
    assert "bert-sst2" in first.stdout, first.stdout

    # The controller's notification for the lost machine: its title says which job.
    rows = [r for r in Store(root / "orch.db").outbox() if r.payload["event"] == "machine_lost"]
    assert len(rows) == 1, rows
    title = Message.from_dict(rows[0].payload).title()
    assert "bert-sst2" in title, title

    other = tmp_path / "other-mirror"
    other.mkdir()
    second = _watch_once(root, f"file://{other}")
    assert second.returncode == 0, second
    assert "bert-sst2" not in second.stdout and UID[:12] not in second.stdout, second.stdout
    assert f"no jobs in file://{other}" in second.stdout
