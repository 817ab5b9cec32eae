"""A full disk, for real: a small tmpfs mounted by the test (skipped, with the reason, where
mounting is not allowed) holds the run folders, or the whole $ORCH_HOME.

1. A built-in job's checkpoint write meets ENOSPC: the write fails cleanly (no temp file left), the
   previous checkpoint stays valid, the job fails with a reason naming the bytes free and needed, a
   `disk_full` event and a notification; the daemon goes on serving another job; once space is
   freed, `orch retry` resumes from that previous checkpoint.
2. The state disk full: `orch submit` says so (exit 1, no traceback), the database passes
   SQLite's integrity check and holds what it held; the daemon survives and runs the queue once
   space is back."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)

from orchestrator.spec.config import load_config
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.model.states import JobState
from orchestrator.home.paths import Home
from orchestrator.home.wake import counters, poke

pytestmark = pytest.mark.slow


@pytest.fixture
def small_fs(tmp_path: Path):
    """A factory: small_fs("8m") -> a fresh tmpfs of that size, unmounted at teardown."""
    mounts: list[Path] = []

    def make(size: str) -> Path:
        mnt = tmp_path / f"fs{len(mounts)}"
        mnt.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here ({(done.stderr or done.stdout).strip()}); the full-disk tests "
                "need root or CAP_SYS_ADMIN"
            )
        mounts.append(mnt)
        return mnt

    yield make
    for mnt in mounts:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(folder: Path, leave: int) -> Path:
    """Write a filler file leaving about `leave` bytes free."""
    filler = folder / "filler"
    free = shutil.disk_usage(folder).free
    with open(filler, "wb") as fh:
        fh.truncate(0)
        chunk = b"\0" * (1 << 16)
        todo = max(0, free - leave)
        while todo > 0:
            todo -= fh.write(chunk[: min(len(chunk), todo)])
        fh.flush()
        os.fsync(fh.fileno())
    return filler


def test_a_checkpoint_that_does_not_fit_fails_cleanly_and_the_previous_one_resumes(small_fs, orch_home, tmp_path):
    from training.resume.checkpoints import checkpoint_problem
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    mnt = small_fs("8m")
    texts = [r["text"] for r in sentiment_rows(300, seed=1)]
    model = build_tiny_bert(
        tmp_path / "tiny-bert", texts, hidden=64, layers=2, heads=2, vocab_size=300, max_positions=64
    )
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(96, seed=3))
    h = orch_home(cpu_slots=2, grace_seconds=5)
    (h.root / "runs").rmdir()
    (mnt / "runs").mkdir(mode=0o700)
    (h.root / "runs").symlink_to(mnt / "runs")
    config = h.root / "config.toml"
    config.write_text(
        config.read_text() + '\n[[notifiers]]\ntype = "webhook"\nurl = "http://127.0.0.1:9/x"\n'
        'events = ["failed", "disk_full"]\n'
    )
    h.config = load_config(config, required=True)
    h.start_daemon()
    spec = {
        "name": "big",
        "gpus": 0,
        "retries": 2,
        "model": {"name_or_path": str(model)},
        "data": {"train": str(train), "max_length": 32, "num_workers": 0},
        "train": {"max_steps": 8, "batch_size": 8, "precision": "32", "seed": 3},
        "checkpoint": {"every_n_steps": 4, "keep": 3},
        "env": {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
            "OMP_NUM_THREADS": "1",
            "ORCH_FAULT_SLOW_STEP_S": "0.25",
        },
    }
    path = h.jobs_dir / "big.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job_id = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0).id
    poke(h.home.wake_socket)
    ckpts = h.run_dir(job_id) / "checkpoints"
    first = ckpts / "step-00000004.ckpt"
    wait_for(first.exists, 120, interval=0.05, what="the first checkpoint")
    size = first.stat().st_size
    filler = fill(mnt, leave=size // 3)  # the next checkpoint needs `size` bytes: a third of it is free

    job = h.wait_state(job_id, JobState.FAILED, JobState.SUCCEEDED, timeout=90)
    log = (h.run_dir(job_id) / "attempt-1.log").read_text(errors="replace")
    assert job.state is JobState.FAILED, (job.reason, log[-2000:])
    assert job.attempt == 1, ("a full disk is not retried into the same full disk", job.reason, log[-3000:])
    print(f"\nfull disk: {job.reason}")
    assert job.reason.startswith("disk full: saving step-00000008.ckpt needed"), job.reason
    needed_mb = float(job.reason.split("needed ")[1].split(" MB")[0])
    free_mb = float(job.reason.split("had ")[1].split(" MB free")[0])
    assert abs(needed_mb * 1e6 - size) < 0.05 * size and free_mb * 1e6 < size, job.reason
    assert "step-00000004.ckpt is intact" in job.reason and f"orch retry {job_id}" in job.reason
    assert "orch: job failed: disk full" in log and "Traceback" not in log
    assert [e.kind for e in h.store.events(job_id)][-2:] == ["failed", "disk_full"]
    sent = sorted(r.payload["event"] for r in h.store.outbox() if r.job_id == job_id)
    assert sent == ["disk_full", "failed"], sent
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")], list(ckpts.iterdir())
    assert checkpoint_problem(first) is None

    # The daemon keeps serving other jobs meanwhile.
    other = h.submit("other")
    h.wait_state(other, JobState.SUCCEEDED, timeout=30)

    # Space back: `orch retry` resumes from the checkpoint the full disk did not touch.
    filler.unlink()
    retried = h.cli("retry", str(job_id))
    assert retried.returncode == 0, retried.stderr
    job = h.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=120)
    assert job.state is JobState.SUCCEEDED, job.reason
    assert h.store.attempts(job_id)[1].resumed_from_step == 4


def test_orch_submit_and_the_daemon_on_a_full_state_disk(small_fs, tmp_path):
    mnt = small_fs("3m")
    home = mnt / "home"
    job = tmp_path / "job.toml"
    job.write_text(f'name = "small"\ngpus = 0\ncommand = ["{sys.executable}", "-c", "print(1)"]\n')

    def orch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    assert orch("submit", str(job)).returncode == 0
    started = orch("daemon", "start")
    assert started.returncode == 0, started.stderr
    try:
        wait_for(lambda: "succeeded" in orch("status", "--all").stdout, 30, what="the first job")
        filler = fill(mnt, leave=0)
        refused = orch("submit", str(job))
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert "is full" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        con = sqlite3.connect(f"file:{home / 'orch.db'}?mode=ro", uri=True)
        try:
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 1
        finally:
            con.close()
        # A few ticks of the daemon on the full disk, as it counts them (asked on its socket: no file)
        before = wait_for(lambda: counters(Home(home).wake_socket), 30, what="the daemon's counters")
        wait_for(lambda: (c := counters(Home(home).wake_socket)) and c["ticks"] >= before["ticks"] + 3, 30)
        assert "daemon running" in orch("daemon", "status").stdout
        filler.unlink()
        again = orch("submit", str(job))
        assert again.returncode == 0, again.stderr
        wait_for(lambda: orch("status", "--all").stdout.count("succeeded") == 2, 30, what="the second job")
    finally:
        orch("daemon", "stop")
