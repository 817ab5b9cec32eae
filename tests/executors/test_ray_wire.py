"""The Ray executor's calls to the head made off the tick's lock (executors/ray/wire.py): a start
only queues the submit and the next exchange sends it; a stop of a job still pending in Ray is
sent by the exchange and its exit record written once Ray took it; a job no node can hold fails at
once (exit 78) and a submit the head refuses ends the attempt (exit 127), each with its reason. An
in-process daemon (real store, real ticks) against a loopback HTTP server that speaks the part of
Ray's Jobs REST API orch uses and answers at once. No Ray needed."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401  (fixture)
from orchestrator.contract import EX_CONFIG
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.planning.capacity import gpu_slots
from orchestrator.model.states import JobState


class Head:
    """Takes submits (PENDING until the test says otherwise), stops them, lists them; nodes of
    `node_gpus` GPUs each; `refuse`: answer every submit with that HTTP 400 text."""

    def __init__(self, node_gpus: tuple[int, ...] = (1, 1)) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.stops: list[str] = []
        self.refuse = ""
        self.node_gpus = node_gpus
        self.lock = threading.Lock()
        head = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                with head.lock:
                    if self.path.endswith("/stop"):
                        sid = self.path.split("/")[-2]
                        head.stops.append(sid)
                        if sid in head.jobs:
                            head.jobs[sid]["status"] = "STOPPED"
                        return self.answer(200, {"stopped": sid in head.jobs})
                    if head.refuse:
                        return self.answer(400, head.refuse)
                    sid = body["submission_id"]
                    head.jobs[sid] = {"submission_id": sid, "status": "PENDING", "entrypoint": body["entrypoint"]}
                return self.answer(200, {"submission_id": sid})

            def do_GET(self) -> None:
                with head.lock:
                    if self.path.startswith("/api/jobs/") and self.path != "/api/jobs/":
                        sid = self.path.rsplit("/", 1)[-1]
                        return self.answer(200, head.jobs[sid]) if sid in head.jobs else self.answer(404, "no")
                    if self.path.startswith("/api/jobs"):
                        return self.answer(200, list(head.jobs.values()))
                    if self.path.startswith("/nodes"):
                        nodes = [
                            {"raylet": {"nodeId": f"{i:02d}" * 28, "state": "ALIVE", "resourcesTotal": {"GPU": g}}}
                            for i, g in enumerate(head.node_gpus)
                        ]
                        return self.answer(200, {"data": {"summary": nodes}})
                    if self.path.startswith("/api/cluster_status"):
                        usage = {"GPU": [0.0, float(sum(head.node_gpus))]}
                        return self.answer(200, {"data": {"clusterStatus": {"loadMetricsReport": {"usage": usage}}}})
                self.answer(404, "no such page")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()


@pytest.fixture
def head() -> Iterator[Head]:
    h = Head()
    yield h
    h.server.shutdown()
    h.server.server_close()
    h.thread.join(10)


def ray_home(orch_home, head: Head) -> OrchHome:
    ray = {"address": head.address, "poll_seconds": 0.05, "timeout_seconds": 5.0}
    return orch_home(cpu_slots=2, config={"executor": {"kind": "ray"}, "ray": ray})


def test_a_start_is_submitted_by_the_exchange_and_a_pending_job_stopped_there(orch_home, head):
    h = ray_home(orch_home, head)
    d = h.local_daemon()
    job = h.submit("pending", hold="never")
    h.tick_until(d, lambda: len(head.jobs) == 1, what="the submit to reach the head")
    (sid,) = head.jobs
    assert sid == f"orch-{h.job(job).uid}-1" and h.state(job) is JobState.RUNNING
    h.tick_until(d, lambda: "PENDING" in (h.job(job).executor_ref.get("where") or ""), what="Ray's PENDING published")
    assert h.cli("cancel", str(job)).returncode == 0
    done = h.tick_state(d, job, JobState.CANCELLED)
    assert head.stops == [sid] and done.cost == 0.0  # pending in Ray: never billed
    assert "stopped while pending in Ray" in (h.run_dir(job) / "attempt-1.log").read_text()


def test_a_job_no_node_can_hold_fails_at_once_with_the_reason(orch_home, head):
    h = ray_home(orch_home, head)
    d = h.local_daemon()
    path = h.job_file("too-big", gpus=2, hold="never")
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=len(gpu_slots(h.config))).id
    done = h.tick_state(d, job, JobState.FAILED)
    assert h.exit_record(job, 1)["code"] == EX_CONFIG and head.jobs == {}
    assert "the largest node of the Ray cluster" in done.reason and "has 1" in done.reason, done.reason


def test_a_submit_the_head_refuses_ends_the_attempt_with_its_words(orch_home, head):
    head.refuse = "runtime_env: bad pip spec"
    h = ray_home(orch_home, head)
    d = h.local_daemon()
    job = h.submit("refused", hold="never")
    h.tick_state(d, job, JobState.FAILED)
    assert h.exit_record(job, 1)["code"] == 127 and head.jobs == {}
    log = (h.run_dir(job) / "attempt-1.log").read_text()
    assert "Ray refused the job" in log and "bad pip spec" in log, log
