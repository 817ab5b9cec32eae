"""A preemption notice never waits behind a Ray head that does not answer (issue 44): the daemon's
calls to the head (submit, stop, the job list) run off its tick lock (executors/ray/wire.py,
daemon/executor_io.py), so the notice handler, which needs that lock, SIGTERMs the jobs it can
reach while a submit is still held by the head. A real `orch daemon run` configured for Ray, a
real file notice, a real `orch run` job beside it (a local process the daemon signals), and a
loopback HTTP server that speaks enough of Ray's Jobs REST API and holds every submit unanswered.
No Ray needed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from daemon_harness import orch_home, wait_for  # noqa: F401  (fixture)
from orchestrator.model.states import Intent, JobState


class SilentHead:
    """Answers the job list, the nodes and the GPU usage at once; takes every POST /api/jobs/
    and never answers it until `release` (the test's end)."""

    def __init__(self) -> None:
        self.submits_held = 0  # POSTs read and not answered
        self.submits_answered = 0
        self.released = threading.Event()
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
                self.rfile.read(int(self.headers["Content-Length"]))
                if not self.path.startswith("/api/jobs/") or self.path.endswith("/stop"):
                    return self.answer(200, {"stopped": True})
                with head.lock:
                    head.submits_held += 1
                head.released.wait(300)
                with head.lock:
                    head.submits_held -= 1
                    head.submits_answered += 1
                self.answer(500, "the test is over")

            def do_GET(self) -> None:
                if self.path.startswith("/api/jobs"):
                    return self.answer(200, [])
                if self.path.startswith("/nodes"):
                    node = {"nodeId": "ab" * 28, "nodeManagerAddress": "127.0.0.1", "state": "ALIVE"}
                    return self.answer(200, {"data": {"summary": [{"raylet": {**node, "resourcesTotal": {"GPU": 1}}}]}})
                if self.path.startswith("/api/cluster_status"):
                    usage = {"GPU": [0.0, 1.0]}
                    return self.answer(200, {"data": {"clusterStatus": {"loadMetricsReport": {"usage": usage}}}})
                self.answer(404, "no such page")

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # the daemon gone before the late answer: not the next test's business

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def held(self) -> int:
        with self.lock:
            return self.submits_held


@pytest.fixture
def head() -> Iterator[SilentHead]:
    h = SilentHead()
    yield h
    h.released.set()
    h.server.shutdown()
    h.server.server_close()
    h.thread.join(10)


def test_a_notice_reaches_the_local_job_while_the_ray_head_holds_a_submit(orch_home, head):
    ray = {"address": head.address, "poll_seconds": 0.2, "timeout_seconds": 2.0, "submit_timeout_seconds": 300.0}
    preemption = {"sources": ["file"], "poll_seconds": 0.2}
    h = orch_home(
        cpu_slots=2, grace_seconds=10, config={"executor": {"kind": "ray"}, "ray": ray, "preemption": preemption}
    )
    fg_file = h.job_file("fg", hold="never", on_term=75)
    fg = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(h.root), "run", str(fg_file)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=h.env(),
        start_new_session=True,
    )
    try:
        h.wait_record("fg", "start", timeout=60)
        h.start_daemon()
        # The cluster's GPUs as the head told them, not [ray] max_gpus's slot numbers.
        assert "GPUs the ray cluster's (1 in all, 0 in use; orch keeps at most 64 busy)" in h.log_text()
        on_ray = h.submit("on-ray", hold="never")
        wait_for(
            lambda: head.held() == 1,
            60,
            what=lambda: f"the submit to reach the head ({h.job(on_ray)}; daemon log:\n{h.log_tail(30)})",
        )

        (h.root / "preempt-notice").touch()
        h.wait_record("fg", "sigterm", timeout=60)
        # Told while the head still held the submit: before, the tick held its lock across the
        # submit (60 s by default, 300 here) and the notice waited behind it.
        assert head.held() == 1 and head.submits_answered == 0
        ray_job = wait_for(lambda: (j := h.job(on_ray)).intent is Intent.PREEMPT and j, 30, what="the Ray job told")
        assert ray_job.state in (JobState.RUNNING, JobState.QUEUED)
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait(10)
