"""moto's EC2 server as a process of its own on loopback, with fake credentials in the
environment and every request recorded (moto's own recorder), for the recovery tests that talk to
EC2: the `aws` provider's, and the AWS CLI launch script's of the docs. Never real AWS."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ec2Server:
    """moto_server in a process of its own, recording every request to a file."""

    def __init__(self, folder: Path):
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.recording = folder / "requests.jsonl"
        env = dict(os.environ, MOTO_RECORDER_FILEPATH=str(self.recording))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self._api("reset-recording")
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        self._api("start-recording")

    def _api(self, verb: str) -> bytes:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{verb}", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return bytes(resp.read())

    def requests(self, action: str) -> list[dict[str, str]]:
        """The form fields of every recorded EC2 request of `action`, oldest first."""
        out = []
        for line in self.recording.read_text().splitlines():
            entry = json.loads(line)
            body = entry.get("body") or ""
            if entry.get("body_encoded"):
                body = base64.b64decode(body).decode()
            fields = dict(urllib.parse.parse_qsl(body))
            if fields.get("Action") == action:
                out.append(fields)
        return out

    def stop(self) -> None:
        self.proc.kill()  # nothing to save: its state dies with the test module
        self.proc.wait(10)


@contextlib.contextmanager
def ec2_server_running(folder: Path, secret: str = "fake-secret-key") -> Iterator[Ec2Server]:
    """The server, with fake credentials and region in os.environ while it runs (restored after)."""
    fake = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in [*fake, "AWS_PROFILE"]}
    os.environ.update(fake)
    os.environ.pop("AWS_PROFILE", None)
    server = Ec2Server(folder)
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
