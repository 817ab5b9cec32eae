"""An attempt's secret file (host/secret_file.py), how a cluster job gets what must never stand in
the cluster's job table: owner-only from its first byte whatever the umask, whole or absent after
a write that fails half-way (a real file-size limit, in a real subprocess), read once and deleted
by the job side, removed by the daemon without fuss when it is already gone. And which variables
count as secret (host/cluster_env.py, the redaction rule's names plus job.toml secret_env)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.host.cluster_env import missing_pass_env, slurm_basics, split_secrets
from orchestrator.host.secret_file import remove_secret_file, secret_file, take_secret_file, write_secret_file

SECRETS = {"WANDB_API_KEY": "wandb-" + "k" * 36, "DB_URL": "postgres://me:pw@db/x"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_file_is_owner_only_even_under_an_open_umask_and_holds_the_values(tmp_path):
    old = os.umask(0)  # what a careless service manager may hand the daemon
    try:
        path = write_secret_file(tmp_path, 3, SECRETS)
    finally:
        os.umask(old)
    assert path == secret_file(tmp_path, 3) and path.name == "attempt-3.secrets.json"
    assert mode(path) == 0o600
    assert json.loads(path.read_text()) == SECRETS
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left beside it


def test_no_reader_ever_sees_a_secret_file_or_its_temp_file_readable_by_others(tmp_path):
    """A watcher lists the folder and stats every entry as fast as it can while the writer writes
    a hundred times under umask 0: every entry it ever catches, temp or final, is 0600."""
    seen: dict[str, set[int]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for entry in os.scandir(tmp_path):
                try:
                    seen.setdefault(entry.name, set()).add(stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))
                except FileNotFoundError:
                    pass  # renamed or removed between the listing and the stat

    watcher = threading.Thread(target=watch)
    old = os.umask(0)
    watcher.start()
    try:
        for n in range(100):
            write_secret_file(tmp_path, 1, {**SECRETS, "N": str(n)})
    finally:
        stop.set()
        watcher.join()
        os.umask(old)
    assert "attempt-1.secrets.json" in seen, seen
    assert all(modes == {0o600} for modes in seen.values()), seen


WRITE_UNDER_A_SIZE_LIMIT = """
import resource, signal, sys
from pathlib import Path
from orchestrator.host.secret_file import write_secret_file
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
try:
    write_secret_file(Path(sys.argv[1]), 2, {"HF_TOKEN": "x" * 4096})
except OSError as exc:
    print("refused", exc.errno)
"""


def test_a_write_that_fails_half_way_leaves_the_old_file_whole_and_no_temp_file(tmp_path):
    before = write_secret_file(tmp_path, 2, {"HF_TOKEN": "old"}).read_bytes()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", WRITE_UNDER_A_SIZE_LIMIT, str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert out.stdout.split() == ["refused", "27"], out.stdout + out.stderr  # EFBIG, mid-write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempt-2.secrets.json"]
    assert secret_file(tmp_path, 2).read_bytes() == before


def test_the_job_side_reads_it_once_and_it_is_gone(tmp_path):
    write_secret_file(tmp_path, 4, SECRETS)
    assert take_secret_file(tmp_path, 4) == SECRETS
    assert not secret_file(tmp_path, 4).exists()
    with pytest.raises(FileNotFoundError):
        take_secret_file(tmp_path, 4)  # a second reader finds nothing


def test_a_torn_file_is_refused_without_its_content_and_still_deleted(tmp_path):
    path = secret_file(tmp_path, 5)
    path.write_text('{"WANDB_API_KEY": "wandb-abcdef')
    with pytest.raises(ValueError) as caught:
        take_secret_file(tmp_path, 5)
    assert "wandb-abcdef" not in str(caught.value) and "not JSON" in str(caught.value)
    assert not path.exists()


def test_the_daemon_removes_it_whether_or_not_it_is_there(tmp_path):
    write_secret_file(tmp_path, 6, SECRETS)
    assert remove_secret_file(tmp_path, 6) and not secret_file(tmp_path, 6).exists()
    assert remove_secret_file(tmp_path, 6)  # already gone: nothing to do, no error


@pytest.mark.parametrize(
    "name, secret_env, secret",
    [
        ("WANDB_API_KEY", [], True),  # one of the redaction rule's names
        ("AWS_SECRET_ACCESS_KEY", [], True),
        ("SMTP_PASSWORD", [], True),  # named like a credential
        ("MY_SERVICE_TOKEN", [], True),
        ("HF_ENDPOINT", [], False),
        ("TOKENIZERS_PARALLELISM", [], False),  # "token" inside a name is not a credential's name
        ("AWS_ACCESS_KEY_ID", [], False),  # an id, not a key
        ("DB_URL", ["DB_URL"], True),  # marked by the job
        ("ORCH_JOB_ID", [], False),
    ],
)
def test_which_variables_go_through_the_secret_file(name, secret_env, secret):
    public, hidden = split_secrets({name: "v"}, {"secret_env": secret_env})
    assert (name in hidden, name in public) == (secret, not secret)


@pytest.mark.parametrize(
    "value, secret",
    [
        ("https://mlflow.internal:5000", False),
        ("https://me:hunter2@mlflow.internal:5000", True),  # a credential in a URL
        ("hf_" + "A" * 34, True),  # a token's shape under a plain name
        ("https://hf-mirror.com", False),
        ("false", False),
    ],
)
def test_a_value_that_holds_a_credential_is_secret_whatever_its_name(value, secret):
    public, hidden = split_secrets({"MLFLOW_TRACKING_URI": value}, {})
    assert ("MLFLOW_TRACKING_URI" in hidden) == secret and ("MLFLOW_TRACKING_URI" in public) != secret


def test_a_slurm_job_gets_only_the_basics_of_the_daemons_environment_and_missing_pass_env_is_named():
    daemon = {"PATH": "/usr/bin", "HOME": "/home/me", "AWS_SECRET_ACCESS_KEY": "s", "MY_TOOL_FLAGS": "-x"}
    assert slurm_basics(daemon) == {"PATH": "/usr/bin", "HOME": "/home/me"}
    assert missing_pass_env({"HF_TOKEN": "t"}, {"pass_env": ["HF_TOKEN", "HF_HOME"]}) == ["HF_HOME"]
