"""Real servers on loopback for the notifier tests: a scripted HTTP server that records what it
received and answers what the test says, and an aiosmtpd inbox with AUTH. A uniquely named
module (not conftest) so test files can import it whatever other conftest.py is loaded."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit


@dataclass
class Received:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Answer:
    status: int = 200
    body: Any = field(default_factory=dict)  # dict -> JSON; str -> sent as text
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    # Set: the answer's status and headers go at once, then a space every 0.2 s (so no read
    # timeout of the client's ever fires) until the test sets the event; then the body.
    hold: Optional[threading.Event] = None


class ProviderServer:
    """Answers every POST with `self.answer`, recording each request in `self.requests`."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.open = 0  # requests received and not yet answered in full
        self.answer = Answer()
        self.script: list[Answer] = []  # answered first, in order; then `answer` for ever
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                parts = urlsplit(self.path)
                outer.requests.append(
                    Received(
                        "POST",
                        parts.path,
                        parse_qs(parts.query),
                        {k.lower(): v for k, v in self.headers.items()},
                        self.rfile.read(length),
                    )
                )
                answer = outer.script.pop(0) if outer.script else outer.answer
                if answer.delay_s:
                    time.sleep(answer.delay_s)
                raw = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
                data = raw.encode("utf-8")
                if answer.hold is not None:
                    outer.open += 1
                    try:
                        self._answer_held(answer, data)
                    finally:
                        outer.open -= 1
                    return
                try:
                    self.send_response(answer.status)
                    ctype = "text/html" if isinstance(answer.body, str) else "application/json; charset=utf-8"
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in answer.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def _answer_held(self, answer: Answer, data: bytes) -> None:
                assert answer.hold is not None
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Connection", "close")  # no length: the body ends when the connection does
                    self.end_headers()
                    self.wfile.flush()
                    while not answer.hold.wait(0.2):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # A short poll interval: shutdown() waits up to one interval.
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def reply(
        self,
        status: int = 200,
        body: Any = None,
        *,
        delay_s: float = 0.0,
        headers: dict[str, str] | None = None,
        hold: Optional[threading.Event] = None,
    ) -> None:
        self.answer = Answer(status, {} if body is None else body, delay_s, headers or {}, hold)

    def then(self, status: int = 200, body: Any = None) -> None:
        """Queue one answer for the next request, before the standing `reply`."""
        self.script.append(Answer(status, {} if body is None else body))

    @property
    def last(self) -> Received:
        assert self.requests, "the server received no request"
        return self.requests[-1]

    def close(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()


# ---- SMTP ---------------------------------------------------------------------------------

USER, PASSWORD = "me@example.com", "auth-code-1234abcd"


class Inbox:
    """aiosmtpd handler keeping every accepted message."""

    def __init__(self) -> None:
        self.envelopes: list[tuple[str, list[str], EmailMessage]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's naming
        mail = message_from_bytes(envelope.content, policy=policy.default)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos), mail))
        return "250 Message accepted for delivery"


def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> Any:
    from aiosmtpd.smtp import AuthResult, LoginPassword

    ok = (
        isinstance(auth_data, LoginPassword)
        and auth_data.login.decode() == USER
        and auth_data.password.decode() == PASSWORD
    )
    # handled=False: let aiosmtpd answer "535" itself (its default assumes we already replied).
    return AuthResult(success=ok, handled=False)


def free_port() -> int:
    # aiosmtpd's Controller probes its own port after starting, so it cannot bind port 0.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class SmtpServer:
    mode: str
    host: str
    port: int
    inbox: Inbox
    ca_file: str
