"""The loopback S3 server the mirror tests use (moto's ThreadedMotoServer), in a module of its own:
a test that needs a server of its own imports it from here (never from conftest, whose module
name several test folders share)."""

from __future__ import annotations

import socket
import urllib.request
import uuid
from typing import Any


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        port = _free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.paused_server: Any = None

    def bucket(self) -> str:
        name = f"orch-{uuid.uuid4().hex[:12]}"
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=10).read()
        return name

    def stop(self) -> None:
        self.server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
