"""provenance/diff.patch leaves the machine masked: a key written into an uncommitted change of a
real git checkout is recorded whole on the machine that submitted it (the user's own `git apply`),
and the copy read back from a real bucket (the loopback S3 server, and a file:// mirror) holds the
mask instead, by the one redaction rule the dashboard uses too."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from daemon_harness import OrchHome

from orchestrator.contract import DIFF_PATCH, PROVENANCE, provenance_dir
from orchestrator.daemon.mirror.files import FileSync
from orchestrator.objectstore import manifest as mf

API_KEY = "wandb-0123456789abcdef0123456789abcdef"
ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo, check=True, capture_output=True
    )


def _checkout_with_a_key_uncommitted(repo: Path) -> None:
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("import os\nLR = 0.1\n")
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "train.py").write_text(
        f'import os\nLR = 0.2\nWANDB_API_KEY = "{API_KEY}"\nos.environ["AWS_ACCESS_KEY_ID"] = "{ACCESS_KEY_ID}"\n'
    )


def test_a_key_in_an_uncommitted_file_reaches_the_bucket_masked(remote, tmp_path: Path):
    repo = tmp_path / "repo"
    _checkout_with_a_key_uncommitted(repo)
    h = OrchHome(tmp_path / "machine")
    try:
        job_toml = repo / "job.toml"
        job_toml.write_text('name = "keyed"\ngpus = 0\ncommand = ["python", "train.py"]\n')
        job = h.job(h.submit(job_toml))
        local = (provenance_dir(h.run_dir(job.id)) / DIFF_PATCH).read_text()
        assert API_KEY in local and ACCESS_KEY_ID in local  # the submitting machine keeps the whole diff

        FileSync(h.home, h.store, remote.settings, remote).sync_files(job, time.time(), None)

        sent = remote.get_bytes(mf.file_key(job.uid, f"{PROVENANCE}/{DIFF_PATCH}"))
        assert sent is not None, "diff.patch was not uploaded"
        text = sent.decode()
        assert API_KEY not in text and ACCESS_KEY_ID not in text, text
        assert '+WANDB_API_KEY = "***"' in text and "+LR = 0.2" in text, text  # the change itself still reads
    finally:
        h.cleanup()
