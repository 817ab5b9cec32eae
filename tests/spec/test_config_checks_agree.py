"""`orch submit`, `orch config check` and the daemon's start make the same config.toml checks (issue
37, item 10): a mistake one of them refuses, the others refuse too, with the same line, and
nothing is queued. Real `orch` processes on a real home."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

BAD_CONFIGS = {
    "notifier with kind for type": (
        '[[notifiers]]\nname = "team"\nkind = "wecom"\nwebhook_key = "k"\n',
        "kind = 'wecom': did you mean 'type'?",
    ),
    "s3 storage without credentials": ('[storage]\nurl = "s3://bucket/prefix"\n', "s3:// needs credentials"),
}


def orch(home: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ORCH_HOME", "ORCH_CONFIG") and not k.startswith(("AWS_", "GOOGLE_", "AZURE_"))
    }
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def queued_jobs(home: Path) -> int:
    if not (home / "orch.db").exists():
        return 0
    with sqlite3.connect(home / "orch.db") as db:
        return db.execute("SELECT count(*) FROM jobs").fetchone()[0]


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_submit_config_check_and_daemon_start_refuse_the_same_config_with_the_same_line(tmp_path: Path, case: str):
    text, problem = BAD_CONFIGS[case]
    home, config, job = tmp_path / "home", tmp_path / "config.toml", tmp_path / "job.toml"
    config.write_text(text)
    job.write_text('name = "x"\ngpus = 0\ncommand = ["true"]\n')
    said = {}
    for verb in (["config", "check"], ["submit", str(job)], ["daemon", "run"]):
        out = orch(home, config, *verb)
        assert out.returncode == 2, (verb, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        lines = [line for line in out.stderr.splitlines() if problem in line]
        assert len(lines) == 1 and str(config) in lines[0], (verb, out.stderr)
        said[verb[0]] = lines[0]
    assert len(set(said.values())) == 1, said
    assert queued_jobs(home) == 0


def test_a_secret_only_the_daemons_boot_env_holds_lets_submit_queue(tmp_path: Path):
    """`orch daemon install` starts the daemon with $ORCH_HOME/boot.env: a secret kept there and not
    in the submitting shell is the daemon's, so submit and config check accept it; without the
    file, both refuse with the variable's name."""
    home, config, job = tmp_path / "home", tmp_path / "config.toml", tmp_path / "job.toml"
    config.write_text(
        '[[notifiers]]\ntype = "email"\nhost = "127.0.0.1"\nport = 2525\nusername = "me@example.com"\n'
        'password_env = "ORCH_TEST_BOOT_ONLY_PASSWORD"\nto = ["me@example.com"]\n'
    )
    job.write_text('name = "x"\ngpus = 0\ncommand = ["true"]\n')
    refused = orch(home, config, "submit", str(job))
    assert refused.returncode == 2 and "ORCH_TEST_BOOT_ONLY_PASSWORD is not set" in refused.stderr
    assert queued_jobs(home) == 0
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "boot.env").write_text("# written by hand\nexport ORCH_TEST_BOOT_ONLY_PASSWORD='s3cret-value'\n")
    for verb in (["config", "check"], ["submit", str(job)]):
        out = orch(home, config, *verb)
        assert out.returncode == 0, (verb, out.stderr)
        assert "s3cret-value" not in out.stdout + out.stderr
    assert queued_jobs(home) == 1
