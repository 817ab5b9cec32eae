"""Helpers for the cost, budget, hook and idle tests, on top of the one daemon harness
(daemon_harness.OrchHome): a config from a whole dict, a small command job that follows the
job-process contract (checkpoint, progress, SIGTERM -> notice checkpoint + 75), and a loopback
webhook receiver."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import tomli_w

from daemon_harness import OrchHome, wait_for  # noqa: F401  (wait_for: re-exported to the cost tests)

PY = sys.executable

# A command job: optional checkpoint and progress.json, sleep, SIGTERM -> notice checkpoint + 75.
JOB_SCRIPT = r"""
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
"""


class Orch(OrchHome):
    """An OrchHome configured from a whole config dict, with the cost tests' command jobs."""

    def __init__(self, tmp: Path, config: dict[str, Any], *, gpus_on_cpu: bool = False):
        cfg = json.loads(json.dumps(config))
        cfg["daemon"] = {"tick_seconds": 0.25, "grace_seconds": 10, **cfg.get("daemon", {})}
        super().__init__(tmp, cfg, gpus_on_cpu=gpus_on_cpu)
        self.cost_script = tmp / "cost_job.py"
        self.cost_script.write_text(JOB_SCRIPT)

    def write_config(self, config: dict[str, Any]) -> None:
        self.configure(config)

    def command_job(
        self, name: str, *, gpus: int = 0, retries: int = 0, budget: Optional[dict] = None, **behaviour: Any
    ) -> Path:
        spec: dict[str, Any] = {
            "name": name,
            "gpus": gpus,
            "retries": retries,
            "command": [PY, str(self.cost_script), json.dumps(behaviour)],
        }
        if budget:
            spec["budget"] = budget
        path = self.tmp / f"{name}.toml"
        path.write_text(tomli_w.dumps(spec))
        return path


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

    def make(config: dict[str, Any], *, gpus_on_cpu: bool = False) -> Orch:
        folder = tmp_path / f"o{len(made)}"
        folder.mkdir()
        made.append(Orch(folder, config, gpus_on_cpu=gpus_on_cpu))
        return made[-1]

    yield make
    for o in made:
        o.cleanup()
