"""Pending adoptions: a planned move's new machine boots while the old one still holds the job's
lease, so its bootstrap's one `orch adopt --job UID --yes` is refused ("still owned by"). When the
holder is the one a planned move takes the job from (a launch claim made `move_for` its home, or a
move request naming it), the refusal leaves a pending adoption in this home
(`pending-adopt/<uid>.json`) instead, and exits 0; this machine's daemon tries it again every tick
(off the tick's lock) and completes it once the holder hands the job over (its lease released) --
so every documented bootstrap, adopt once then `orch daemon start`, completes a move as written.
A pending adoption ends when it is adopted, refused for another reason (the job finished, or is
here already), or after MAX_AGE_S (the move was abandoned; the controller stops this machine).

`orch adopt --wait` waits in the foreground instead, for any held lease."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..objectstore import claims as cl
from ..objectstore import moves
from ..objectstore.remote import Remote, StorageError

FOLDER = "pending-adopt"
MAX_AGE_S = 6 * 3600.0  # a move not handed over in six hours will not be: give up waiting
log = logging.getLogger("orch.adopt")


def move_for_holder(remote: Remote, uid: str, holder_home: str) -> Optional[str]:
    """A line naming the planned move that takes job `uid` from `holder_home`, or None."""
    if not holder_home:
        return None
    try:
        request = moves.read(remote, uid)
        if (
            request is not None
            and request.from_home == holder_home
            and request.status
            in (
                moves.ASKED,
                moves.HANDED_OVER,
                moves.LAUNCHED,
            )
        ):
            return f"a planned move to {request.to} ({request.status})"
        for c in reversed(cl.read_claims(remote, uid)):
            if c.extra.get("move_for") == holder_home and c.status in (cl.CLAIMED, cl.LAUNCHED):
                return f"a planned move to {c.market} (launch {c.n})"
    except StorageError:
        return None
    return None


def folder(home: Any) -> Path:
    return Path(home.root) / FOLDER


def park(home: Any, url: str, uid: str, maps: list[str], why: str, now: float, *, gpus: Optional[int] = None) -> None:
    """`gpus`: the `--gpus N` it was asked with, kept for the daemon's try."""
    d = folder(home)
    d.mkdir(mode=0o700, exist_ok=True)
    tmp = d / f".{uid}.tmp"
    tmp.write_text(json.dumps({"url": url, "uid": uid, "maps": maps, "why": why, "since": now, "gpus": gpus}))
    tmp.replace(d / f"{uid}.json")


def pending(home: Any) -> list[dict[str, Any]]:
    d = folder(home)
    out = []
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("uid") and record.get("url"):
            out.append(record)
    return out


def drop(home: Any, uid: str) -> None:
    try:
        (folder(home) / f"{uid}.json").unlink()
    except FileNotFoundError:
        pass


def wait_loop(attempt: Callable[[], bool], timeout_s: float, every_s: float = 2.0) -> bool:
    """`orch adopt --wait`: call `attempt` (True: nothing left to wait for) until it says so."""
    deadline = time.monotonic() + timeout_s
    while True:
        if attempt():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
