"""Loopback servers that speak the cloud metadata formats the way the providers document them:
AWS IMDSv2 (token PUT required), GCP metadata (Metadata-Flavor: Google required) and Azure
Scheduled Events (Metadata: true required). Tests flip them between "nothing" and "preempted"."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator, Optional

import pytest

Reply = tuple[int, str]  # status, body


class Fake:
    """A provider's metadata server: `reply(method, path, headers, body)` -> (status, body).
    `delay_s` makes every answer slow; `hold` (an Event) keeps every answer until the test sets
    it; `requests` records (method, path, headers), `answered` counts the answers sent."""

    delay_s = 0.0

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.hold: Optional[threading.Event] = None
        self.answered = 0

    def reply(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        raise NotImplementedError


class FakeAws(Fake):
    def __init__(self) -> None:
        super().__init__()
        self.tokens: set[str] = set()
        self.ttls: list[str] = []
        self.instance_action: Reply = (404, "<html>Not Found</html>")
        self.rebalance: Reply = (404, "<html>Not Found</html>")
        self.instance_id: Reply = (404, "<html>Not Found</html>")

    def revoke_tokens(self) -> None:
        self.tokens.clear()

    def reply(self, method, path, headers, body):
        if path == "/latest/api/token":
            if method != "PUT" or "x-aws-ec2-metadata-token-ttl-seconds" not in headers:
                return 400, "Missing or Invalid Parameters"
            self.ttls.append(headers["x-aws-ec2-metadata-token-ttl-seconds"])
            token = f"token-{len(self.ttls)}"
            self.tokens.add(token)
            return 200, token
        if headers.get("x-aws-ec2-metadata-token") not in self.tokens:
            return 401, "Unauthorized"
        if path == "/latest/meta-data/spot/instance-action":
            return self.instance_action
        if path == "/latest/meta-data/events/recommendations/rebalance":
            return self.rebalance
        if path == "/latest/meta-data/instance-id":
            return self.instance_id
        return 404, "Not Found"


class FakeGcp(Fake):
    def __init__(self) -> None:
        super().__init__()
        self.preempted = "FALSE"
        self.maintenance: Reply = (200, "NONE")

    def reply(self, method, path, headers, body):
        if headers.get("metadata-flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header."
        if path == "/computeMetadata/v1/instance/preempted":
            return 200, self.preempted
        if path == "/computeMetadata/v1/instance/maintenance-event":
            return self.maintenance
        return 404, "Not Found"


class FakeAzure(Fake):
    def __init__(self) -> None:
        super().__init__()
        self.incarnation = 1
        self.events: list[dict] = []
        self.raw: Reply | None = None  # overrides the document when set
        self.acknowledged: list[dict] = []

    def add_event(self, **event) -> None:
        self.events.append(event)
        self.incarnation += 1

    def reply(self, method, path, headers, body):
        if headers.get("metadata") != "true":
            return 400, json.dumps({"error": "Bad request. Required metadata header not specified"})
        if path != "/metadata/scheduledevents?api-version=2020-07-01":
            return 400, json.dumps({"error": "Bad request. api-version was not specified"})
        if method == "POST":
            self.acknowledged.append(json.loads(body))
            return 200, ""
        if self.raw is not None:
            return self.raw
        return 200, json.dumps({"DocumentIncarnation": self.incarnation, "Events": self.events})


def _handler_for(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            fake.requests.append((self.command, self.path, headers))
            if fake.delay_s:
                time.sleep(fake.delay_s)
            if fake.hold is not None:
                fake.hold.wait(60)
            status, text = fake.reply(self.command, self.path, headers, body)
            fake.answered += 1
            data = text.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up (timeout test)
                pass

        do_GET = do_PUT = do_POST = _serve

        def log_message(self, *args) -> None:
            pass

    return Handler


@pytest.fixture
def serve() -> Iterator[Callable[[Fake], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(fake: Fake) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(fake))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def closed_port_url():
    # Bound and never listened on: connections are refused, and while the test holds the socket no
    # other test (another xdist worker) can take the port and answer.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
