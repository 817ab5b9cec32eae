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


class FreezableS3Server:
    """The same moto server in a process of its own, so it can be frozen: SIGSTOP leaves its socket
    listening (the kernel still accepts connections and takes bytes) but nothing answers, as a hung
    endpoint does, unlike a stopped server whose refused connections fail at once. SIGCONT thaws it."""

    def __init__(self) -> None:
        import os
        import signal
        import subprocess
        import sys
        import time

        self._signal = signal
        port = _free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        deadline = time.monotonic() + 60
        while True:  # until it answers (a busy machine imports moto slowly)
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not start (exit {self.proc.poll()})") from None
                time.sleep(0.2)

    bucket = S3Server.bucket

    def freeze(self) -> None:
        self.proc.send_signal(self._signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(self._signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(self._signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


class ThrottledProxy:
    """A loopback TCP proxy in front of a server that passes what the client sends at `rate`
    bytes/s (answers at full speed): a slow uplink, as a far-away bucket gives a cheap machine."""

    def __init__(self, target_endpoint: str, rate: float) -> None:
        import threading

        self.target_port = int(target_endpoint.rsplit(":", 1)[1])
        self.rate = rate
        self.passed = 0  # bytes passed on to the server so far: a test sees an upload under way
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=_pipe, args=(client, server, self.rate, self), daemon=True).start()
            threading.Thread(target=_pipe, args=(server, client, 0.0), daemon=True).start()

    def stop(self) -> None:
        self.listener.close()


def _pipe(src: socket.socket, dst: socket.socket, rate: float, meter: "ThrottledProxy | None" = None) -> None:
    import time

    try:
        while data := src.recv(16384):
            dst.sendall(data)
            if meter is not None:
                meter.passed += len(data)
            if rate:
                time.sleep(len(data) / rate)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
