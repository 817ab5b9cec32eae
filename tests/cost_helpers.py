"""Helpers for the cost, budget, hook and idle tests: a temp $ORCH_HOME with a config.toml, a
small command job that follows the job-process contract, a real `orch daemon run` subprocess,
a loopback webhook receiver, and polling with a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import tomli_w

from orchestrator.config import load_config
from orchestrator.gpus import managed_gpus
from orchestrator.lifecycle import submit_job
from orchestrator.paths import Home
from orchestrator.records import Job
from orchestrator.states import JobState
from orchestrator.store import Store
from orchestrator.wake import poke
from daemon_harness import kill_leftover_attempts, wait_for  # noqa: F401  (wait_for: re-exported to the cost tests)

PY = sys.executable

# A command job: optional checkpoint and progress.json, sleep, SIGTERM -> notice checkpoint + 75.
JOB_SCRIPT = r'''
import json, os, signal, sys, time
b = json.loads(sys.argv[1])
ck = os.environ["ORCH_CKPT_DIR"]
os.makedirs(ck, exist_ok=True)
def on_term(signum, frame):
    if b.get("notice_ckpt") is not None:
        open(os.path.join(ck, "notice-step-%08d.ckpt" % b["notice_ckpt"]), "w").write("x")
    os._exit(75)
signal.signal(signal.SIGTERM, on_term)
if b.get("ckpt") is not None:
    open(os.path.join(ck, "step-%08d.ckpt" % b["ckpt"]), "w").write("x")
if b.get("step") is not None:
    tmp = os.path.join(os.environ["ORCH_RUN_DIR"], ".progress.tmp")
    json.dump({"step": b["step"], "total_steps": b.get("total"), "updated_at": time.time()}, open(tmp, "w"))
    os.replace(tmp, os.path.join(os.environ["ORCH_RUN_DIR"], "progress.json"))
time.sleep(b.get("sleep", 0))
code = b.get("exit", 0)
per = b.get("exit_per_attempt", {}).get(os.environ.get("ORCH_ATTEMPT", ""))
sys.exit(code if per is None else per)
'''


class Orch:
    """One $ORCH_HOME: its config.toml, store, jobs and daemons (all stopped by `cleanup`)."""

    def __init__(self, tmp: Path, config: dict[str, Any]):
        self.tmp = tmp
        self.root = tmp / "home"
        self.home = Home(self.root).ensure()
        self.script = tmp / "job.py"
        self.script.write_text(JOB_SCRIPT)
        self.daemons: list[subprocess.Popen] = []
        self.write_config(config)
        self.store = Store(self.home.db)

    def write_config(self, config: dict[str, Any]) -> None:
        cfg = json.loads(json.dumps(config))
        daemon = {"tick_seconds": 0.25, "grace_seconds": 10, "gpus": [], **cfg.get("daemon", {})}
        cfg["daemon"] = daemon
        (self.root / "config.toml").write_text(tomli_w.dumps(cfg))
        self.config = load_config(self.root / "config.toml", required=True)

    # -- jobs ------------------------------------------------------------------------------

    def command_job(self, name: str, *, gpus: int = 0, retries: int = 0, budget: Optional[dict] = None,
                    **behaviour: Any) -> Path:
        spec: dict[str, Any] = {"name": name, "gpus": gpus, "retries": retries,
                                "command": [PY, str(self.script), json.dumps(behaviour)]}
        if budget:
            spec["budget"] = budget
        path = self.tmp / f"{name}.toml"
        path.write_text(tomli_w.dumps(spec))
        return path

    def submit(self, path: Path, *, not_before: Optional[float] = None) -> int:
        """What `orch submit` does, in-process (saves a CLI start-up): submit_job + a poke."""
        job = submit_job(self.store, self.config, self.home, path, now=time.time(), not_before=not_before,
                         machine_gpus=len(managed_gpus(self.config.daemon.gpus)))
        poke(self.home.wake_socket)
        return job.id

    def job(self, job_id: int) -> Job:
        return self.store.get(job_id)

    def wait_state(self, job_id: int, *states: JobState, timeout: float = 30.0) -> Job:
        wait_for(lambda: self.job(job_id).state in states, timeout,
                 f"job {job_id} to become {'/'.join(s.value for s in states)} (is {self.job(job_id).state.value});"
                 f" daemon log:\n{self.log_tail()}")
        return self.job(job_id)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.home.log_file.read_text().splitlines()[-n:])
        except OSError:
            return ""

    # -- CLI and daemon ----------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "orchestrator.cli.app", "--home", str(self.root), *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=self.env())

    def cli_json(self, *args: str) -> Any:
        out = self.cli(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
        env.pop("ORCH_HOME", None)
        env.pop("ORCH_CONFIG", None)
        return env

    def start_daemon(self, timeout: float = 30.0) -> subprocess.Popen:
        before = self.log_text().count("daemon started")
        out = open(self.tmp / f"daemon-{len(self.daemons) + 1}.out", "wb")
        proc = subprocess.Popen([PY, "-m", "orchestrator.cli.app", "--home", str(self.root), "daemon", "run"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=self.env())
        out.close()
        self.daemons.append(proc)
        wait_for(lambda: self.log_text().count("daemon started") > before or proc.poll() is not None, timeout,
                 "the daemon to start")
        assert proc.poll() is None, (self.tmp / f"daemon-{len(self.daemons)}.out").read_text()
        return proc

    def log_text(self) -> str:
        try:
            return self.home.log_file.read_text()
        except OSError:
            return ""

    def stop_daemon(self, proc: subprocess.Popen, timeout: float = 30.0) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout)

    def cleanup(self) -> None:
        for proc in self.daemons:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.daemons:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        kill_leftover_attempts(self.home)
        self.store.close()


class WebhookReceiver:
    """A loopback HTTP server that answers 200 to every POST and keeps the JSON bodies."""

    def __init__(self) -> None:
        received: list[dict[str, Any]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append(json.loads(body or b"{}"))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def orch_factory(tmp_path: Path):
    """Generator behind the `make_orch` fixtures: make_orch(config_dict) -> Orch; cleaned up after."""
    made: list[Orch] = []

    def make(config: dict[str, Any]) -> Orch:
        folder = tmp_path / f"o{len(made)}"
        folder.mkdir()
        made.append(Orch(folder, config))
        return made[-1]

    yield make
    for o in made:
        o.cleanup()
