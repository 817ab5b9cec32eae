"""Ray's submit is idempotent by the submission id (executors/ray/api.py), against a real loopback
HTTP server that speaks the shape of Ray's Jobs REST API and can be slow: an answer that comes
after the submit timeout (the head took the job all the same) is adopted, a repeated submit finds
the job Ray already has, and only a head that took nothing is "unreachable". No Ray needed."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from orchestrator.executors.ray.api import RayJobsApi, RayRefused, RayUnreachable


class SlowHead:
    """POST /api/jobs/ takes the job, then answers after `answer_delay_s` (or never takes it
    when `take` is False); GET /api/jobs/<id> answers at once."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.posts = 0
        self.answer_delay_s = 0.0
        self.take = True
        self.refusal = (500, "No available agent to submit job, please try again later.")  # Ray 2.60's words
        head = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                head.posts += 1
                sid = body["submission_id"]
                if sid in head.jobs:  # Ray's own words for a submission id it has
                    return self.answer(
                        400, f"Job with submission_id {sid} already exists. Please use a different submission_id."
                    )
                if not head.take:
                    time.sleep(head.answer_delay_s)
                    return self.answer(head.refusal[0], head.refusal[1])
                head.jobs[sid] = {"submission_id": sid, "status": "PENDING"}
                time.sleep(head.answer_delay_s)
                self.answer(200, {"job_id": None, "submission_id": sid})

            def do_GET(self) -> None:
                sid = self.path.rsplit("/", 1)[-1]
                if sid in head.jobs:
                    return self.answer(200, head.jobs[sid])
                self.answer(404, "Job does not exist")

        class Server(ThreadingHTTPServer):
            # The client times out on purpose: a late answer then meets a closed socket. Not an
            # error of the test; printed, it would land in whichever test runs next in this process.
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = False
        self.server.block_on_close = True  # server_close waits for the slow answers still in flight
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def head() -> Iterator[SlowHead]:
    h = SlowHead()
    yield h
    h.server.shutdown()
    h.server.server_close()


def test_a_submit_answered_after_its_timeout_is_adopted_not_lost(head):
    head.answer_delay_s = 1.0  # the head takes the job, then answers past the submit timeout
    api = RayJobsApi(head.address, timeout_s=0.2, submit_timeout_s=0.3)
    assert api.submit({"submission_id": "orch-u-1", "entrypoint": "true"}) == "orch-u-1"
    assert list(head.jobs) == ["orch-u-1"] and head.posts == 1


def test_a_submit_sent_again_with_the_same_id_finds_the_job_ray_has_and_starts_no_second(head):
    api = RayJobsApi(head.address, timeout_s=1.0)
    body = {"submission_id": "orch-u-2", "entrypoint": "true"}
    assert api.submit(body) == "orch-u-2"
    assert api.submit(body) == "orch-u-2"  # the first answer lost: the daemon sends it again
    assert list(head.jobs) == ["orch-u-2"] and head.posts == 2


def test_a_head_that_took_nothing_or_cannot_take_it_now_is_unreachable_and_a_refusal_is_a_refusal(head):
    head.take, head.answer_delay_s = False, 1.0
    api = RayJobsApi(head.address, timeout_s=0.2, submit_timeout_s=0.3)
    with pytest.raises(RayUnreachable, match="does not answer"):
        api.submit({"submission_id": "orch-u-3", "entrypoint": "true"})
    assert head.jobs == {}
    head.answer_delay_s = 0.0  # its job agent not up yet: sent again later, not the attempt's end
    with pytest.raises(RayUnreachable, match="HTTP 500: No available agent"):
        api.submit({"submission_id": "orch-u-3", "entrypoint": "true"})
    head.refusal = (400, "runtime_env: bad pip spec")
    with pytest.raises(RayRefused, match="HTTP 400: runtime_env: bad pip spec"):
        api.submit({"submission_id": "orch-u-3", "entrypoint": "true"})
