"""Issue 47 on a real Ray cluster: a daemon whose environment holds AWS_SECRET_ACCESS_KEY and
SMTP_PASSWORD runs a job whose [env] holds WANDB_API_KEY. The job succeeds and sees its key (from
the attempt's secret file, gone before the job starts), sees nothing of the daemon's environment,
and none of the three values is in what Ray keeps and serves to anyone who reaches its dashboard:
the job list (`GET /api/jobs/`), the job's detail, its logs (`ray job logs` and the driver log it
serves), nor any other file Ray wrote. A job still pending in Ray keeps its secret file owner-only
until `orch cancel` stops it, and then it is gone too."""

from __future__ import annotations

import stat
import subprocess
import urllib.request
from pathlib import Path

from conftest import submit, wait_ray_state
from daemon_harness import OrchHome
from orchestrator.model.states import JobState
from ray_cluster import RAY

DAEMON_SECRETS = {"AWS_SECRET_ACCESS_KEY": "aws-secret-" + "a" * 29, "SMTP_PASSWORD": "smtp-pass-" + "b" * 12}
WANDB_KEY = "wandb-key-" + "c" * 30
PENDING_KEY = "wandb-key-" + "p" * 30
VALUES = [*DAEMON_SECRETS.values(), WANDB_KEY, PENDING_KEY]
WATCHED = ["WANDB_API_KEY", *DAEMON_SECRETS, "DAEMON_ONLY_SETTING"]


def served(h: OrchHome, path: str) -> str:
    """What the dashboard answers anyone, unauthenticated."""
    with urllib.request.urlopen(h.ray.address + path, timeout=10) as r:
        return r.read().decode()


def leaked(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [v for v in VALUES if v.encode() in data]


def files_under(folder: Path) -> bytes:
    out = []
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                out.append(path.read_bytes())
        except OSError:
            pass  # a socket, or a file Ray just rotated
    return b"".join(out)


def test_no_secret_reaches_rays_job_table_and_the_job_still_gets_its_key(ray_home, monkeypatch):
    for name, value in {**DAEMON_SECRETS, "DAEMON_ONLY_SETTING": "daemon-only"}.items():
        monkeypatch.setenv(name, value)  # the daemon's environment (the cluster was started without them)
    h = ray_home(autoscaler=True)  # a job no node can hold is submitted and waits PENDING in Ray
    h.start_daemon()
    job = submit(h, h.job_file("tracked", gpus=1, env={"WANDB_API_KEY": WANDB_KEY}, hold="go", env_keys=WATCHED))
    waiting = submit(h, h.job_file("waiting", gpus=2, env={"WANDB_API_KEY": PENDING_KEY}, hold="go"))

    start = h.wait_record("tracked", "start", timeout=90)
    assert start["env"]["WANDB_API_KEY"] == WANDB_KEY  # through the secret file
    assert {k: start["env"][k] for k in WATCHED[1:]} == dict.fromkeys(WATCHED[1:])  # nothing of the daemon's
    assert not (h.run_dir(job) / "attempt-1.secrets.json").exists()  # read and deleted before the job began

    wait_ray_state(h, waiting, "PENDING")
    pending_file = h.run_dir(waiting) / "attempt-1.secrets.json"
    assert stat.S_IMODE(pending_file.stat().st_mode) == 0o600  # written, owner-only, for a step not yet run
    sids = [h.job(j).executor_ref["submission_id"] for j in (job, waiting)]
    while_running = served(h, "/api/jobs/") + "".join(served(h, f"/api/jobs/{sid}") for sid in sids)
    assert sids[0] in while_running and sids[1] in while_running
    assert leaked(while_running) == []

    assert h.cli("cancel", str(waiting)).returncode == 0
    h.wait_state(waiting, JobState.CANCELLED, timeout=60)
    assert not pending_file.exists()  # the daemon removed it: its step never ran

    h.release("go")
    h.wait_state(job, JobState.SUCCEEDED, timeout=90)
    assert not list(h.run_dir(job).glob("*secrets*"))
    detail = served(h, f"/api/jobs/{sids[0]}")
    assert '"SUCCEEDED"' in detail and "ORCH_JOB_ID" in detail  # the contract is there, the secrets are not
    # `ray job logs` serves the job's driver log through the agent of the node it ran on, which on
    # this one-host cluster may be a worker without an agent of its own ("Port out of range"): what
    # it prints is checked, and so is the file it serves, and every other file Ray wrote.
    logs = subprocess.run(
        [str(RAY), "job", "logs", "--address", h.ray.address, sids[0]], capture_output=True, text=True, timeout=120
    )
    assert leaked(served(h, "/api/jobs/") + detail + logs.stdout + logs.stderr) == []
    driver_logs = list(h.ray.base.rglob(f"job-driver-{sids[0]}.log"))
    assert driver_logs, f"no driver log of {sids[0]} under {h.ray.base}"
    assert leaked("".join(p.read_text(errors="replace") for p in driver_logs)) == []
    assert leaked(files_under(h.ray.base)) == []  # Ray's own logs, the runtime_env agent's included
    assert leaked((h.run_dir(job) / "attempt-1.log").read_text()) == []
    assert leaked(h.log_text()) == []  # nor the daemon's own log
