"""The dashboard answers any input: a token of any encoding in the query, the Authorization header
or the cookie is a 401, an absurd job id a 404, and the connection is never dropped (raw bytes on
a socket, as a hostile client sends them, through the real `orch dashboard` off loopback)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest


@pytest.fixture
def dashboard(sandbox):
    sandbox.orch("status").clean(0)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "--home",
            str(sandbox.home),
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=sandbox.env(),
        text=True,
    )
    line = ""
    deadline = time.monotonic() + 60
    while "token=" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
    m = re.search(r":(\d+)/\?token=(\S+)", line)
    assert m, line
    yield int(m.group(1)), m.group(2)
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err, err


def request(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(raw)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def get(path: bytes, *headers: bytes) -> bytes:
    return (
        b"GET "
        + path
        + b" HTTP/1.1\r\nHost: box:1\r\nConnection: close\r\n"
        + b"".join(h + b"\r\n" for h in headers)
        + b"\r\n"
    )


BAD_TOKENS = [
    ("utf-8 query", get(b"/api/queue?token=%C3%A9%E2%82%AC")),
    ("invalid utf-8 query", get(b"/api/queue?token=%FF%FE")),
    ("raw bytes in query", get(b"/api/queue?token=\xc3\xa9")),
    ("non-ascii bearer", get(b"/api/queue", b"Authorization: Bearer \xc3\xa9\xff")),
    ("non-ascii cookie", get(b"/api/queue", b"Cookie: orch_dashboard=\xe2\x82\xac\xff")),
    ("empty bearer", get(b"/api/queue", b"Authorization: Bearer ")),
    ("surrogate-looking query", get(b"/api/queue?token=%ED%A0%80")),
]


@pytest.mark.parametrize("case,raw", BAD_TOKENS, ids=[c[0] for c in BAD_TOKENS])
def test_a_bad_token_of_any_encoding_is_a_401(dashboard, case, raw):
    port, _ = dashboard
    answer = request(port, raw)
    assert answer.startswith(b"HTTP/1.0 401") or answer.startswith(b"HTTP/1.1 401"), answer[:200]


@pytest.mark.parametrize(
    "path", [b"/api/job/" + b"9" * 40, b"/api/job/99999999999999999999", "/api/job/١٢".encode(), b"/api/job/-1"]
)
def test_an_absurd_job_id_is_a_404(dashboard, path):
    port, token = dashboard
    answer = request(port, get(path, b"Authorization: Bearer " + token.encode()))
    assert answer.split(b"\r\n", 1)[0].endswith(b"404 Not Found"), answer[:200]
