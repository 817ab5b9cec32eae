"""The warm pre-flight beside the daemon: the daemon starts `python -m training.preflight --serve`
in its own interpreter (the one its jobs run with) at its start and stops it at its end; `orch
submit` asks it on $ORCH_HOME/preflight.sock and, whenever it cannot answer (absent, killed, stale,
another interpreter or cache environment), runs the one-shot pre-flight subprocess instead.

Neither side imports the training stack here: this module speaks JSON over a unix socket. Why a
server: importing torch and transformers is most of a one-shot pre-flight's seconds; the checks
themselves take a fraction of one."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from ..home.paths import Home

log = logging.getLogger("orch.preflight")

SOCKET_NAME = "preflight.sock"
# What the server compares with its own before answering (training/ahead/serve.py CACHE_ENV).
CACHE_ENV = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "XDG_CACHE_HOME")


def socket_path(home: Home) -> Path:
    return home.root / SOCKET_NAME


def start(home: Home, cwd: Optional[Path] = None) -> Optional[subprocess.Popen[bytes]]:
    """Start the server as the daemon's child (it exits when this process does); None if it cannot
    start, which only costs submits their speed. Output goes to the daemon's log."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    path = socket_path(home)
    try:
        path.unlink()  # an earlier daemon's: never answered from again
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("the warm pre-flight is not started: cannot remove %s (%s)", path, exc)
        return None
    try:
        with open(home.log_file, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "training.preflight", "--serve", str(path), "--owner", str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                cwd=str(cwd or Path(__file__).resolve().parents[2]),  # where this `training` is
            )
    except OSError as exc:
        log.warning("the warm pre-flight is not started (%s): submits run it as a subprocess", exc)
        return None
    log.info("warm pre-flight starting (pid %d) on %s", proc.pid, path)
    return proc


def stop(proc: Optional[subprocess.Popen[bytes]], home: Home) -> None:
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        socket_path(home).unlink()
    except OSError:
        pass


def ask(home: Home, request: dict[str, Any], python: str, timeout: float) -> Optional[dict[str, Any]]:
    """The warm server's answer to `request`, or None when the CLI must run the subprocess: no
    server, one that is stale or declines, or one running another interpreter than `python`."""
    path = socket_path(home)
    if not path.exists():
        return None
    payload = json.dumps({**request, "cache_env": {k: os.environ.get(k) for k in CACHE_ENV}}).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(path))
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)
            chunks = []
            while True:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:  # refused (a killed server's socket), reset, or past the timeout
        return None
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        return None
    if not isinstance(answer, dict) or "problems" not in answer or answer.get("python") != python:
        return None
    return answer
