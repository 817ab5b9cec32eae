"""Issue 47 on a real private Slurm: a daemon whose environment holds AWS_SECRET_ACCESS_KEY and
SMTP_PASSWORD runs a job whose [env] holds WANDB_API_KEY. The job succeeds and sees its key (from
the attempt's secret file, gone before srun starts) and nothing of the daemon's environment but
the basics; none of the three values is in the sbatch script, in what `scontrol show job` prints,
in the batch script Slurm keeps, in anything under Slurm's state and spool folders (where it keeps
each job's environment) or in the environment of the job's batch step. A job cancelled while it
is still pending leaves no secret file either: the daemon removes what the batch step never read."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import slurm_id
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow

DAEMON_SECRETS = {"AWS_SECRET_ACCESS_KEY": "aws-secret-" + "a" * 29, "SMTP_PASSWORD": "smtp-pass-" + "b" * 12}
WANDB_KEY = "wandb-key-" + "c" * 30
VALUES = [*DAEMON_SECRETS.values(), WANDB_KEY]
WATCHED = ["WANDB_API_KEY", *DAEMON_SECRETS, "DAEMON_ONLY_SETTING"]


def leaked(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [v for v in VALUES if v.encode() in data]


def files_under(folder: Path) -> bytes:
    out = b""
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                out += Path(root, name).read_bytes()
            except OSError:
                pass  # a socket or a file Slurm just replaced
    return out


def test_no_secret_in_what_slurm_keeps_and_the_job_still_gets_its_key(slurm_home, monkeypatch):
    for name, value in {**DAEMON_SECRETS, "DAEMON_ONLY_SETTING": "daemon-only"}.items():
        monkeypatch.setenv(name, value)  # the daemon's environment
    h = slurm_home()
    h.start_daemon()
    job = h.submit("tracked", env={"WANDB_API_KEY": WANDB_KEY}, hold="go", env_keys=WATCHED)
    sid = slurm_id(h, job)
    start = h.wait_record("tracked", "start", timeout=60)
    assert start["env"]["WANDB_API_KEY"] == WANDB_KEY  # through the secret file
    assert {k: start["env"][k] for k in WATCHED[1:]} == dict.fromkeys(WATCHED[1:])  # nothing of the daemon's
    run = h.run_dir(job)
    assert not (run / "attempt-1.secrets.json").exists()  # read and deleted before srun started

    shown = h.slurm.run("scontrol", "-dd", "show", "job", sid).stdout
    assert f"JobId={sid}" in shown and leaked(shown) == []
    kept_script = h.slurm.run("scontrol", "write", "batch_script", sid, "-").stdout
    assert "orchestrator.executors.slurm.step" in kept_script and leaked(kept_script) == []
    assert leaked((run / "attempt-1.sbatch").read_text()) == []
    state = files_under(h.slurm.base / "state")  # each job's environment and script, as Slurm keeps them
    assert f"ORCH_JOB_ID={job}".encode() in state and leaked(state) == []
    assert leaked(files_under(h.slurm.base / "spool")) == []  # what the nodes keep of the running job
    batch_pid = json.loads((run / "attempt-1.slurm.json").read_text())["wrapper_pid"]
    batch_env = Path(f"/proc/{batch_pid}/environ").read_bytes()  # the environment Slurm gave the job
    assert b"ORCH_JOB_ID=" in batch_env and leaked(batch_env) == [] and b"DAEMON_ONLY_SETTING" not in batch_env

    h.release("go")
    h.wait_state(job, JobState.SUCCEEDED, timeout=60)
    assert not list(run.glob("*secrets*"))
    assert leaked((run / "attempt-1.log").read_text()) == []
    assert leaked(files_under(h.slurm.base / "log")) == []  # slurmctld's and the nodes' logs, job completions


def test_a_job_cancelled_while_pending_in_slurm_leaves_no_secret_file(slurm_home):
    h = slurm_home()
    h.start_daemon()
    path = h.job_file("later", env={"WANDB_API_KEY": WANDB_KEY})
    path.write_text(path.read_text().replace("[env]", '[slurm]\nextra_args = ["--begin=now+3600"]\n[env]'))
    job = h.submit(path)
    slurm_id(h, job)
    secrets = h.run_dir(job) / "attempt-1.secrets.json"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600  # written for a batch step that has not run
    assert h.cli("cancel", str(job)).returncode == 0
    h.wait_state(job, JobState.CANCELLED, timeout=60)
    assert not secrets.exists() and h.records("later", "start") == []
