"""What an attempt hands a cluster (host/cluster_env.py), without a cluster: a real attempt begun on
a real store, submitted by the real Ray executor to a loopback server that records what Ray's
Jobs API would keep (and serve to anyone who reaches the dashboard), and the real job-side steps
run as subprocesses. Only what orch gives the attempt crosses, never the daemon's environment and
never a secret; the secrets travel in the owner-only secret file, which the step reads, deletes
and hands to the job, and which is gone when the submit is refused. The local executor still
runs the job with the daemon's whole environment. The real clusters: tests/ray_executor/
test_ray_secrets.py and tests/slurm/test_slurm_secrets.py."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from daemon_harness import OrchHome, orch_home  # noqa: F401  (fixture)
from orchestrator.executors import executor_of_kind
from orchestrator.host.secret_file import secret_file, write_secret_file
from orchestrator.jobs.attempts import begin_attempt
from orchestrator.jobs.lifecycle import submit_job

REPO = Path(__file__).resolve().parents[2]
DAEMON_SECRETS = {"AWS_SECRET_ACCESS_KEY": "aws-secret-" + "a" * 29, "SMTP_PASSWORD": "smtp-pass-" + "b" * 12}
WANDB_KEY = "wandb-key-" + "c" * 30
DB_URL = "postgres://orch:db-pass-dddddddd@db.internal/runs"
HF_TOKEN = "hf-token-" + "e" * 20
VALUES = [*DAEMON_SECRETS.values(), WANDB_KEY, DB_URL, HF_TOKEN]
KEY_SHA = hashlib.sha256(WANDB_KEY.encode()).hexdigest()


class RecordingHead:
    """POST /api/jobs/ keeps the body as Ray would (or refuses it with Ray's 400 when `refuse`)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.refuse = False
        self.busy = False  # 503: the head's own trouble, an attempt waits in the daemon
        head = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                code, answer = (400, "runtime_env: invalid") if head.refuse else (200, {"submission_id": "x"})
                if head.busy:
                    code, answer = 503, "No available agent to submit job, please try again later."
                if code == 200:
                    head.bodies.append(body)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def head() -> Iterator[RecordingHead]:
    h = RecordingHead()
    yield h
    h.server.shutdown()
    h.server.server_close()


JOB = """\
name = "tracked"
gpus = {gpus}
command = ["python", "train.py"]
pass_env = ["HF_TOKEN", "HF_HOME", "NOT_SET_HERE"]
secret_env = ["DB_URL"]
[env]
WANDB_API_KEY = "{wandb}"
DB_URL = "{db}"
HF_ENDPOINT = "https://hf-mirror.example"
"""


def begin(h: OrchHome, kind: str, gpus: int = 0) -> Any:
    """A real attempt of the job above, begun as the daemon begins it, with the daemon's environment."""
    path = h.jobs_dir / "tracked.toml"
    path.write_text(JOB.format(wandb=WANDB_KEY, db=DB_URL, gpus=gpus))
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=gpus)
    environ = {
        "PATH": os.environ["PATH"],
        "DAEMON_ONLY_SETTING": "daemon-only-value",
        "HF_HOME": "/data/hf",
        "HF_TOKEN": HF_TOKEN,
        **DAEMON_SECRETS,
    }
    begun = begin_attempt(h.store, h.config, h.home, h.job(job.id), [], time.time(), environ=environ, executor=kind)
    return begun.launch


def sent(executor, started: dict) -> None:
    """The start only queued the submit (the tick's lock is held); the exchange sends it, off the lock."""
    executor.wire.exchange({started["executor_ref"]["submission_id"]: None}, time.time())


def ray_home(h: OrchHome, head: RecordingHead) -> None:
    h.configure({"executor": {"kind": "ray"}, "ray": {"address": head.address}})


def test_a_ray_job_description_holds_what_orch_gives_the_attempt_and_no_secret(orch_home, head):
    h = orch_home()
    ray_home(h, head)
    launch = begin(h, "ray")
    executor = executor_of_kind("ray", h.config, h.home)
    sent(executor, executor.start(launch))

    (body,) = head.bodies
    kept = json.dumps(body)  # everything Ray would keep and serve
    assert not [v for v in VALUES if v in kept], kept
    env = body["runtime_env"]["env_vars"]
    assert env["HF_ENDPOINT"] == "https://hf-mirror.example" and env["HF_HOME"] == "/data/hf"  # [env], pass_env
    assert env["ORCH_JOB_ID"] == str(launch.job_id) and env["ORCH_ATTEMPT"] == "1"  # the contract
    assert "DAEMON_ONLY_SETTING" not in env and "PATH" not in env  # never the daemon's environment
    assert "--with-secrets" in body["entrypoint"]

    path = secret_file(launch.run_dir, 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"WANDB_API_KEY": WANDB_KEY, "DB_URL": DB_URL, "HF_TOKEN": HF_TOKEN}
    log = (launch.run_dir / "attempt-1.log").read_text()
    assert "pass_env names NOT_SET_HERE, which the daemon's environment does not have" in log, log
    assert not [v for v in VALUES if v in log]


def test_a_refused_submit_leaves_no_secret_file(orch_home, head):
    h = orch_home()
    ray_home(h, head)
    launch = begin(h, "ray")
    head.refuse = True
    executor = executor_of_kind("ray", h.config, h.home)
    sent(executor, executor.start(launch))
    exit_record = json.loads((launch.run_dir / "attempt-1.exit").read_text())
    assert exit_record["code"] == 127  # the head said no: the attempt ends, its secret file with it
    assert not secret_file(launch.run_dir, 1).exists()
    assert not [p.name for p in launch.run_dir.iterdir() if "secrets" in p.name]


def test_an_attempt_waiting_for_a_busy_head_keeps_its_secret_file_for_the_submit_to_come(orch_home, head):
    h = orch_home()
    ray_home(h, head)
    launch = begin(h, "ray", gpus=1)  # the head is asked for its nodes first: it cannot answer that either
    head.busy = True
    executor = executor_of_kind("ray", h.config, h.home)
    assert executor.start(launch)["executor_ref"]["state"] == "UNSUBMITTED"
    assert stat.S_IMODE(secret_file(launch.run_dir, 1).stat().st_mode) == 0o600  # the step will need it
    assert head.bodies == []


def test_the_local_executor_still_gives_the_job_the_daemons_whole_environment(orch_home):
    h = orch_home()
    launch = begin(h, "local")
    assert launch.env["DAEMON_ONLY_SETTING"] == "daemon-only-value"
    assert {k: launch.env[k] for k in DAEMON_SECRETS} == DAEMON_SECRETS
    assert launch.env["WANDB_API_KEY"] == WANDB_KEY and launch.env["HF_TOKEN"] == HF_TOKEN
    assert not secret_file(launch.run_dir, 1).exists()  # nothing to hide on this machine


# The job: says whether it got its key (checked against its sha256, given on its command line, which
# the step prints) and whether the secret file was already gone when it began.
PROBE = (
    "import hashlib, os, sys; from pathlib import Path\n"
    "ok = hashlib.sha256(os.environ.get('WANDB_API_KEY', '').encode()).hexdigest() == sys.argv[1]\n"
    "gone = not Path(os.environ['RUN'], 'attempt-1.secrets.json').exists()\n"
    "print('key', 'ok' if ok else 'WRONG', 'file', 'gone' if gone else 'STILL THERE')\n"
)


def step_env(run_dir: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "RUN": str(run_dir), **more}


def test_the_ray_step_hands_the_job_its_secrets_after_deleting_the_file_and_never_prints_them(tmp_path):
    write_secret_file(tmp_path, 1, {"WANDB_API_KEY": WANDB_KEY})
    step = [sys.executable, "-m", "orchestrator.executors.ray.step", "--run-dir", str(tmp_path), "--attempt", "1"]
    ran = subprocess.run(
        [*step, "--with-secrets", "--", sys.executable, "-c", PROBE, KEY_SHA],
        env=step_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    log = (tmp_path / "attempt-1.log").read_text()
    assert "key ok file gone" in log and WANDB_KEY not in log, log
    assert not secret_file(tmp_path, 1).exists()


def test_a_ray_step_whose_secret_file_is_missing_does_not_start_the_job(tmp_path):
    step = [sys.executable, "-m", "orchestrator.executors.ray.step", "--run-dir", str(tmp_path), "--attempt", "1"]
    ran = subprocess.run(
        [*step, "--with-secrets", "--", sys.executable, "-c", "import os; open(os.environ['RUN'] + '/ran', 'w')"],
        env=step_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 1
    log = (tmp_path / "attempt-1.log").read_text()
    assert "cannot read its secret file" in log and not (tmp_path / "ran").exists(), log
    assert json.loads((tmp_path / "attempt-1.exit").read_text())["code"] == 1


FAKE_SRUN = '#!/bin/sh\nshift 3\nexec "$@"\n'  # drops --kill-on-bad-exit, --nodes, --ntasks-per-node


def test_the_slurm_batch_step_hands_srun_the_secrets_and_keeps_them_out_of_its_own_environment(tmp_path):
    srun = tmp_path / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_secret_file(run_dir, 1, {"WANDB_API_KEY": WANDB_KEY})
    ran = subprocess.run(
        [sys.executable, "-m", "orchestrator.executors.slurm.step", "batch", "--run-dir", str(run_dir)]
        + ["--attempt", "1", "--with-secrets", "--", sys.executable, "-c", PROBE, KEY_SHA],
        env=step_env(run_dir, ORCH_SRUN=str(srun)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    log = (run_dir / "attempt-1.log").read_text()  # the task's output (rank 0)
    assert "key ok file gone" in log and WANDB_KEY not in log + ran.stdout + ran.stderr, log
    assert json.loads((run_dir / "attempt-1.exit").read_text())["code"] == 0
