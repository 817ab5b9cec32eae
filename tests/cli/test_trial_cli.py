"""What a demanding new user met on the command line (the trial of issue 44's session): a pipe
closed by `head`, retry limits that would stop a job the moment it starts, a secret typed into a
command, a mirror URL or bucket key that is wrong. Each ends with one line and the promised exit
code, never a crash report, and changes nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import ORCH_EXE

TOKEN = "hf_" + "a1B2" * 8  # the shape of a Hugging Face token


def _state(home, job_id: int) -> tuple[str, float | None, int]:
    conn = sqlite3.connect(home / "orch.db")
    try:
        return conn.execute("SELECT state, max_cost, gpus FROM jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        conn.close()


@pytest.fixture
def cancelled_job(cli, good_job, home):
    cli("submit", good_job).assert_ok()
    cli("cancel", "1").assert_ok()
    return 1


def test_a_reader_that_closes_the_pipe_early_gets_no_crash_report(cli, good_job, home):
    cli("submit", good_job).assert_ok()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(ORCH_HOME=str(home), NO_COLOR="1")
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `orch status | head -1` is once head has its line: no reader left
    try:
        ran = subprocess.run(
            [ORCH_EXE, "status", "--all"], stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=60
        )
    finally:
        os.close(write_end)
    err = ran.stderr.decode()

    assert ran.returncode == 141, err  # as a filter killed by SIGPIPE ends
    assert "unexpected error" not in err and "Traceback" not in err, err
    assert not (home / "crash-reports").exists()


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--budget=0", "orch retry --budget 0: job 1 has already cost 0.00; give more than that"),
        ("--hours=0", "orch retry --hours 0: job 1 has already run 0.00 h; give more than that"),
        ("--gpus=3", "orch retry --gpus 3: this machine has 2 GPUs (config [daemon] gpus, else nvidia-smi)"),
    ],
)
def test_a_retry_that_could_never_run_is_refused_and_changes_nothing(flag, expected, cli, home, cancelled_job):
    (home / "config.toml").write_text("[daemon]\ngpus = [0, 1]\n")
    before = _state(home, cancelled_job)

    ran = cli("retry", str(cancelled_job), flag).assert_failed(2)

    assert ran.err.strip() == expected
    assert _state(home, cancelled_job) == before == ("cancelled", None, 0)


def test_show_masks_a_token_typed_into_the_command_unless_revealed(cli, write_file):
    job = write_file(
        "job.toml",
        f"""\
        gpus = 0
        command = ["python", "train.py", "--hub-token={TOKEN}", "--db", "postgres://me:pw@db/x", "--pw", "hunter2hunter"]
        secret_env = ["DB_PASS"]
        [env]
        DB_PASS = "hunter2hunter"
        """,
    )
    (job.parent / "train.py").write_text("")
    cli("submit", job).assert_ok()

    shown = cli("show", "1").assert_ok().out + cli("show", "1", "--json").assert_ok().out
    revealed = json.loads(cli("show", "1", "--json", "--reveal").assert_ok().out)

    for secret in (TOKEN, "me:pw@", "hunter2hunter"):
        assert secret not in shown
    assert "--hub-token=***" in shown
    assert f"--hub-token={TOKEN}" in revealed["spec"]["command"]


def test_the_attempt_logs_first_line_masks_the_commands_secrets(tmp_path):
    env = {**os.environ, "MY_API_KEY": "s3cr3t-value-123"}
    ran = subprocess.run(
        [sys.executable, "-m", "orchestrator.executors.supervisor", "--run-dir", str(tmp_path), "--attempt", "1", "--"]
        + [sys.executable, "-c", "pass", f"--token={TOKEN}", "--key", "s3cr3t-value-123"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )

    first = ran.stdout.splitlines()[0]
    assert first.startswith("[orch] attempt 1 started"), ran.stdout + ran.stderr
    assert TOKEN not in first and "s3cr3t-value-123" not in first
    assert "--token=***" in first


def test_a_mirror_url_typed_wrong_is_named_as_typed(cli):
    ran = cli("status", "--url", "bogus://x").assert_failed(2)

    assert ran.err.strip() == (
        "the URL 'bogus://x': unknown scheme 'bogus' in 'bogus://x': use one of s3://, gs://, az://, file://"
    )


def test_an_unset_bucket_key_is_named_with_its_config_file(cli, home, tmp_path, monkeypatch):
    monkeypatch.delenv("ORCH_TRIAL_BUCKET_KEY", raising=False)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    home.mkdir()
    config = home / "config.toml"
    config.write_text(f'[storage]\nurl = "file://{bucket}"\nsigning_key_env = "ORCH_TRIAL_BUCKET_KEY"\n')

    ran = cli("status", "--url", f"file://{bucket}").assert_failed(2)

    assert ran.err.startswith(f"{config}: storage.signing_key_env: names ORCH_TRIAL_BUCKET_KEY, which is not set")


def test_adopt_from_a_mistyped_folder_is_refused_not_read_as_no_jobs(cli, tmp_path, job_count):
    ran = cli("adopt", f"file://{tmp_path}/no-such-bucket", "--all", "--yes").assert_failed(2)

    assert "does not exist: check the path, or mount the disk that holds it" in ran.err
    assert job_count() == 0
