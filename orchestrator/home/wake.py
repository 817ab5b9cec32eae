"""A nudge to the daemon so a submit or a finished job does not wait for the next tick: one
datagram on $ORCH_HOME/wake.sock. Best effort — the periodic tick is the safety net."""

from __future__ import annotations

import os
import socket
from pathlib import Path


WAKE = b"w"  # look at the queue now
WARM_PREFLIGHT = b"p"  # a built-in job was submitted: keep the pre-flight warm from now on


def poke(sock_path: Path, what: bytes = WAKE) -> bool:
    """True when a daemon was listening."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.sendto(what, str(sock_path))
        return True
    except OSError:
        return False


def listen(sock_path: Path) -> socket.socket:
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(sock_path))
    os.chmod(sock_path, 0o600)
    return s
