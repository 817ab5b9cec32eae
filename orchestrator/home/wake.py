"""A nudge to the daemon so a submit or a finished job does not wait for the next tick: one
datagram on $ORCH_HOME/wake.sock. Best effort — the periodic tick is the safety net."""

from __future__ import annotations

import json
import os
import secrets
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional


WAKE = b"w"  # look at the queue now
WARM_PREFLIGHT = b"p"  # a built-in job was submitted: keep the pre-flight warm from now on
COUNTERS = b"c"  # how many ticks (and executor exchanges) the daemon has done: answered, acts on nothing


# A socket's address holds at most 107 bytes (sun_path): a home deeper than that (a long $ORCH_HOME,
# a recovery machine's folder) is reached through its folder's descriptor instead (Linux).
MAX_UNIX_PATH = 100


@contextmanager
def unix_address(sock_path: Path) -> Iterator[str]:
    """An address for `sock_path` that bind/connect/sendto accept, however deep its folder."""
    text = str(sock_path)
    if len(os.fsencode(text)) <= MAX_UNIX_PATH:
        yield text
        return
    fd = os.open(sock_path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{sock_path.name}"
    finally:
        os.close(fd)


def poke(sock_path: Path, what: bytes = WAKE) -> bool:
    """True when a daemon was listening."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s, unix_address(sock_path) as address:
            s.setblocking(False)
            s.sendto(what, address)
        return True
    except OSError:
        return False


def listen(sock_path: Path) -> socket.socket:
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with unix_address(sock_path) as address:
        s.bind(address)
    os.chmod(sock_path, 0o600)
    return s


def counters(sock_path: Path, timeout_s: float = 2.0) -> Optional[dict[str, int]]:
    """The daemon's counters ({"ticks", "exchanges"}, and the passes of its threads: "notices",
    "outbox", "mirror" where it has one), asked on the wake socket from an abstract
    socket of our own (no file, so a full disk does not stop it); None when no daemon answers.
    A test waits for ticks it observed before it asserts that nothing happened in them."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.bind(f"\0orch-counters-{os.getpid()}-{secrets.token_hex(4)}")
            s.settimeout(timeout_s)
            with unix_address(sock_path) as address:
                s.sendto(COUNTERS, address)
            data, _ = s.recvfrom(256)
        found = json.loads(data)
        return {k: int(v) for k, v in found.items()} if isinstance(found, dict) else None
    except (OSError, ValueError):
        return None


def answer_counters(sock: socket.socket, sender: Any, found: dict[str, int], **threads: Any) -> None:
    """The daemon's side of `counters`: the answer to the one who asked (gone meanwhile: nothing),
    with each thread's `passes` (None: a thread this daemon does not run)."""
    found = {**found, **{name: int(t.passes) for name, t in threads.items() if t is not None}}
    try:
        sock.sendto(json.dumps(found).encode(), sender)
    except OSError:
        pass
