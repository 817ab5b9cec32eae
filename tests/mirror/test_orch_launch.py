"""`orch launch` and the untrusted bucket, through the real CLI: a job file is refused exactly as
`orch submit` refuses it (exit 2, nothing written to the bucket); a launched job is placed by
`orch watch` in the same home; a job some other writer put in the bucket, never held by a machine,
is reported and never launched, and so is a launched job seen from another controller's home;
`orch status --url` lists the bucket's jobs from a home with no config at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.spec.config import StorageSection

LAUNCH_SH = 'echo "$ORCH_RECOVERY_MARKET $ORCH_RECOVERY_JOBS" >> "$DIR/launched"; echo vm-$ORCH_RECOVERY_LAUNCH\n'


def orch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_HOME", "ORCH_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def controller(tmp: Path, name: str, url: str) -> Path:
    home = tmp / name
    home.mkdir()
    Path(url.removeprefix("file://")).mkdir(exist_ok=True)  # `orch launch` refuses a folder that is not there
    (tmp / "launch.sh").write_text(LAUNCH_SH)
    cfg = {"storage": {"url": url}, "recovery": {"launch": ["bash", str(tmp / "launch.sh")], "poll_seconds": 1.0}}
    (home / "config.toml").write_text(tomli_w.dumps(cfg))
    return home


def job_file(tmp: Path, **extra: object) -> Path:
    path = tmp / "hello.toml"
    path.write_text(tomli_w.dumps({"name": "hello", "command": ["bash", "-c", "echo hi"], **extra}))
    return path


def bucket_jobs(url: str) -> list[str]:
    return Remote(StorageSection(url=url)).list_dirs("jobs")


@pytest.mark.parametrize(
    "extra, says",
    [
        ({"deadline": "2020-01-01T00:00+00:00"}, "is already past"),
        ({"retries": -1}, "retries"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_launch_refuses_what_submit_refuses_the_same_way_and_writes_nothing(tmp_path, extra, says):
    url = f"file://{tmp_path}/bucket"
    home = controller(tmp_path, "ctl", url)
    # gpus = 0: submit also checks this machine's GPUs (launch does not: the job runs elsewhere),
    # and it names every problem of a file at once
    path = job_file(tmp_path, gpus=0, **extra)
    launched = orch(home, "launch", str(path))
    submitted = orch(tmp_path / "other", "submit", str(path))
    assert launched.returncode == 2 and submitted.returncode == 2
    assert says in launched.stderr and launched.stderr == submitted.stderr
    assert "Traceback" not in launched.stderr
    assert bucket_jobs(url) == []


def test_a_sweep_file_is_refused_with_exit_2(tmp_path):
    url = f"file://{tmp_path}/bucket"
    path = tmp_path / "sweep.toml"
    path.write_text('name = "s"\ncommand = ["true"]\n[sweep]\nmetric = "val_loss"\n')
    done = orch(controller(tmp_path, "ctl", url), "launch", str(path))
    assert done.returncode == 2 and "`orch submit` it there" in done.stderr and "Traceback" not in done.stderr
    assert bucket_jobs(url) == []


def test_a_launched_job_is_placed_and_a_planted_one_never(tmp_path, monkeypatch):
    monkeypatch.setenv("DIR", str(tmp_path))
    url = f"file://{tmp_path}/bucket"
    home = controller(tmp_path, "ctl", url)
    done = orch(home, "launch", str(job_file(tmp_path)), "--json")
    assert done.returncode == 0, done.stderr
    uid = json.loads(done.stdout)["uid"]

    # Someone who can write the bucket plants a job no machine ever held.
    remote = Remote(StorageSection(url=url))
    planted = json.loads(remote.get_bytes(mf.manifest_key(uid)) or b"{}")
    planted_uid = "f" * 32
    planted.update(uid=planted_uid, name="planted")
    remote.cas_put(mf.manifest_key(planted_uid), mf.dump(planted), None)

    shown = orch(tmp_path / "laptop", "status", "--url", url)
    assert shown.returncode == 0 and "waits for `orch watch` to place it" in shown.stdout, shown.stdout

    watched = orch(home, "watch", "--once")
    assert watched.returncode == 0, watched.stderr
    assert (tmp_path / "launched").read_text().split() == ["spot", uid]  # its own job only
    assert f"{planted_uid[:12]}  planted  not trusted" in watched.stdout, watched.stdout

    other = controller(tmp_path, "other-ctl", url)  # another home never put the job there
    assert orch(other, "watch", "--once").returncode == 0
    assert (tmp_path / "launched").read_text().split() == ["spot", uid]


def test_status_url_refuses_a_file_mirror_folder_that_does_not_exist(tmp_path):
    """A typo in the folder read as "no jobs" (exit 0); it is refused as `orch watch` refuses it."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    missing = tmp_path / "typo-bucket"
    ran = orch(home, "status", "--url", f"file://{missing}")
    assert ran.returncode == 2, ran
    assert str(missing) in ran.stderr and "does not exist" in ran.stderr and "Traceback" not in ran.stderr
    assert not missing.exists()


def test_launch_without_a_url_says_how_launch_takes_one(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    ran = orch(home, "launch", str(job_file(tmp_path, gpus=0)))
    assert ran.returncode == 2, ran
    assert "orch launch JOB.toml --url s3://bucket/prefix" in ran.stderr and "orch adopt" not in ran.stderr


def test_launch_refuses_a_deadline_nearer_than_the_jobs_estimate(tmp_path):
    from datetime import datetime, timedelta, timezone

    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    url = f"file://{tmp_path}/bucket"
    home = controller(tmp_path, "ctl", url)
    path = job_file(tmp_path, gpus=0)
    assert orch(home, "submit", str(path)).returncode == 0
    store = Store(Home(home).db)  # that job ran here before: two hours
    (row,) = store.jobs()
    store.db.execute("UPDATE jobs SET state='succeeded', run_seconds=7200, cost=1.0 WHERE id=?", (row.id,))
    store.db.commit()
    store.close()
    now = datetime.now(timezone.utc)
    soon = orch(home, "launch", str(path), "--deadline", (now + timedelta(hours=1)).isoformat(timespec="minutes"))
    assert soon.returncode == 2 and "Traceback" not in soon.stderr
    assert "shorter than the job's estimate of 2.00 h" in soon.stderr and "hello.toml" in soon.stderr, soon.stderr
    assert bucket_jobs(url) == []
    later = orch(home, "launch", str(path), "--deadline", (now + timedelta(hours=3)).isoformat(timespec="minutes"))
    assert later.returncode == 0, later.stderr
    assert len(bucket_jobs(url)) == 1


def test_launch_refuses_a_file_bucket_folder_that_does_not_exist_in_one_line(tmp_path):
    """A typo would make a new bucket no `orch watch` reads (exit 0, the job never placed): refused
    as `orch storage check` and `orch watch` refuse it, nothing created, nothing recorded."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    missing = tmp_path / "typo"
    ran = orch(home, "launch", str(job_file(tmp_path, gpus=0)), "--url", f"file://{missing}")
    assert ran.returncode == 2, ran
    assert ran.stderr.strip().count("\n") == 0 and "does not exist" in ran.stderr and str(missing) in ran.stderr
    assert "Traceback" not in ran.stderr and not missing.exists()
