"""Planned market moves in the mirror: `jobs/<uid>/move.json`, next to the manifest. The recovery
controller writes one (create-only) to ask that a job move market -- from on-demand back to spot,
say. The daemon holding the job's lease honours it like a preemption notice for that job alone:
checkpoint, upload, hand the job over (a released manifest), exit 75, `moved` there. The
controller then launches on the new market and, once a machine there has adopted the job, stops
the old one. Every later change (honoured, launched, stopped) is conditional on the object's ETag.

Only a request naming the lease holder's own home (`from_home`) is honoured, so a stale request
never moves the job again from its next machine."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import manifest as mf
from ..model.markets import MARKETS
from .remote import Remote

ASKED, HANDED_OVER, LAUNCHED, DONE, REFUSED = "asked", "handed_over", "launched", "done", "refused"
STATUSES = (ASKED, HANDED_OVER, LAUNCHED, DONE, REFUSED)
MAX_MOVE_BYTES = 16 * 1024


def move_key(uid: str) -> str:
    return f"{mf.job_prefix(uid)}/move.json"


@dataclass
class MoveRequest:
    uid: str
    to: str  # "spot" | "on-demand"
    from_market: str
    why: str
    by: str  # the controller's id
    at: float
    from_home: str  # the lease holder asked to hand the job over
    from_instance: str = ""  # the machine to stop once the job runs elsewhere ("" if unknown)
    status: str = ASKED
    updated_at: float = 0.0
    note: str = ""
    stop: dict[str, Any] = field(default_factory=dict)  # status, tries, next_at, error
    etag: Optional[str] = None

    def to_json(self) -> bytes:
        data = asdict(self)
        data.pop("etag")
        return json.dumps(data, indent=1, sort_keys=True).encode()


def parse(uid: str, raw: bytes, etag: Optional[str]) -> Optional[MoveRequest]:
    """The request, or None when the object is not one (anything odd in an untrusted bucket)."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("status") not in STATUSES or d.get("to") not in MARKETS:
        return None
    stop = d.get("stop")
    try:
        return MoveRequest(
            uid=uid,
            to=str(d["to"]),
            from_market=str(d.get("from_market") or ""),
            why=str(d.get("why") or "")[:500],
            by=str(d.get("by") or "")[:200],
            at=float(d.get("at") or 0.0),
            from_home=str(d.get("from_home") or ""),
            from_instance=str(d.get("from_instance") or "")[:200],
            status=str(d["status"]),
            updated_at=float(d.get("updated_at") or 0.0),
            note=str(d.get("note") or "")[:500],
            stop=stop if isinstance(stop, dict) else {},
            etag=etag,
        )
    except (KeyError, TypeError, ValueError):
        return None


def read(remote: Remote, uid: str) -> Optional[MoveRequest]:
    got = remote.get_with_etag(move_key(uid), max_bytes=MAX_MOVE_BYTES)
    if got is None:
        return None
    return parse(uid, got[0], got[1])


def put_new(remote: Remote, request: MoveRequest) -> MoveRequest:
    """Ask for the move: raises objectstore.remote.Conflict when a request is already there."""
    request.etag = remote.cas_put(move_key(request.uid), request.to_json(), None)
    return request


def update(remote: Remote, request: MoveRequest) -> MoveRequest:
    """Rewrite it, only if it is still the version we hold (Conflict otherwise)."""
    request.etag = remote.cas_put(move_key(request.uid), request.to_json(), request.etag)
    return request


def clear(remote: Remote, uid: str) -> None:
    """A finished move's object: gone, so the next move can be asked."""
    remote.delete(move_key(uid))
