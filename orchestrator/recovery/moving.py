"""The controller's side of a planned market move (objectstore/moves.py has the object, the
daemon's mirror/moves.py the lease holder's side):

  ask          the policy wants a running job on the other market: write jobs/<uid>/move.json
               (create-only) naming the lease holder, and remember it here (a record only this
               controller writes: a move.json nobody here asked for is never acted on);
  handed_over  the holder checkpointed and released the lease for it: launch on `to`;
  launched     ... the launch happened (the request says so);
  settled      a machine on the new market holds the lease: stop the old one (stopping.py);
  refuse       a move asked for a job that finished first is closed, nothing launched.

A controller killed half-way loses nothing: the request, the released manifest and the create-only
claims are all in the bucket, and the next controller (same home) goes on from them."""

from __future__ import annotations

import time
from typing import Any, Optional

from ..jobs.lifecycle import outgoing_for
from ..model.errors import OrchError
from ..model.states import EventKind
from ..objectstore import claims as cl
from ..objectstore import moves
from ..objectstore.manifest_model import MAX_MANIFEST_BYTES, ManifestError
from ..objectstore.manifest_model import parse as parse_manifest
from ..objectstore import manifest as mf
from ..objectstore.remote import Conflict, Remote
from .jobview import claim_instance

UNDER_WAY = (moves.ASKED, moves.HANDED_OVER, moves.LAUNCHED)


class MoveRefused(OrchError):
    """The move cannot be asked (the message says why)."""


def trust_key(uid: str, from_home: str) -> str:
    return f"{uid}:move:{from_home}"


def ask(
    store: Any, remote: Remote, config: Any, uid: str, to: str, why: str, *, by: str, now: float
) -> moves.MoveRequest:
    """Ask that job `uid` move to market `to`. Raises MoveRefused: no such job, finished, no lease
    holder to hand it over, already on `to`, or a move already under way."""
    if to not in moves.MARKETS:
        raise MoveRefused(f"market must be one of {', '.join(moves.MARKETS)} (got {to!r})")
    key = mf.manifest_key(uid)
    got = remote.get_with_etag(key, max_bytes=MAX_MANIFEST_BYTES)
    try:
        m = parse_manifest(got[0], remote.where(key), uid) if got else None
    except ManifestError as exc:
        raise MoveRefused(f"job {uid[:12]}: its manifest is unreadable: {exc}") from None
    if m is None:
        raise MoveRefused(f"no job {uid[:12]} in {remote.url.raw}")
    name = str(m.get("name") or "")
    if m.get("state") not in ("queued", "running"):
        raise MoveRefused(f"job {uid[:12]} ({name}) is {m.get('state')}: a finished job does not move")
    own = dict(m.get("owner") or {})
    if own.get("released") or not own.get("home_id"):
        raise MoveRefused(f"job {uid[:12]} ({name}): no machine holds its lease to hand it over")
    # (A move's new machine, launched before the holder is asked, is not what the job runs on.)
    launched = [c for c in cl.read_claims(remote, uid) if c.status == cl.LAUNCHED and not c.extra.get("move_for")]
    current = launched[-1].market if launched else ""
    if current == to:
        raise MoveRefused(f"job {uid[:12]} ({name}) already runs on {to}")
    existing = moves.read(remote, uid)
    if existing is not None and existing.status in UNDER_WAY:
        raise MoveRefused(f"job {uid[:12]} ({name}): a move to {existing.to} is already under way")
    if existing is not None:
        moves.clear(remote, uid)  # the last move's closed record: make room for this one
    instance = str(own.get("instance_id") or "") or (claim_instance(launched[-1]) if launched else "")
    request = moves.MoveRequest(
        uid=uid,
        to=to,
        from_market=current,
        why=why,
        by=by,
        at=now,
        from_home=str(own["home_id"]),
        from_instance=instance,
        updated_at=now,
    )
    try:
        moves.put_new(remote, request)
    except Conflict:
        raise MoveRefused(f"job {uid[:12]} ({name}): another move request appeared meanwhile") from None
    store.recovery_mark(trust_key(uid, request.from_home), now)
    detail = f"job {uid[:12]} ({name}): planned move from {current or '?'} to {to}: {why}"
    payload = {"event": "market_move", "job_name": name, "state": str(m.get("state")), "reason": detail}
    store.recovery_event(
        f"{uid}:move:{request.from_home}:asked",
        EventKind.MARKET_MOVE.value,
        detail,
        now,
        outgoing_for(config, EventKind.MARKET_MOVE, payload),
    )
    return request


def under_way(store: Any, remote: Remote, uid: str) -> Optional[moves.MoveRequest]:
    """The move this controller asked for the job and that is not closed, or None (a request
    nobody here asked for is ignored: the bucket is untrusted)."""
    request = moves.read(remote, uid)
    if request is None or request.status not in UNDER_WAY:
        return None
    if not store.recovery_marked(trust_key(uid, request.from_home)):
        return None
    return request


def handed_over(store: Any, remote: Remote, uid: str, own: dict[str, Any]) -> Optional[moves.MoveRequest]:
    """The job's lease was released for a move this controller asked: the move, else None."""
    request = under_way(store, remote, uid)
    if request is None or request.from_home != own.get("home_id"):
        return None
    return request


def mark(remote: Remote, request: moves.MoveRequest, status: str, note: str = "", now: Optional[float] = None) -> None:
    request.status, request.updated_at = status, time.time() if now is None else now
    if note:
        request.note = note
    try:
        moves.update(remote, request)
    except Conflict:  # another controller moved it on: its word stands
        pass
