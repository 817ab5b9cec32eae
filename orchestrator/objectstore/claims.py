"""Launch claims in the mirror: `jobs/<uid>/recovery/launch-<nnnn>.json`, one per launch of a
replacement machine for the job, written create-only (If-None-Match on S3/GCS/Azure, an flock'ed
compare on file://) BEFORE the provider is called. Of two controllers on one bucket, or one
restarted mid-launch, only one writer gets launch n; later changes (launched, failed, cancelled)
are conditional on the claim's own ETag. The claims are also what tells anyone reading the mirror
that a job waits for a replacement machine, and since when."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from . import manifest as mf
from .remote import Remote

CLAIMED, LAUNCHED, FAILED, CANCELLED = "claimed", "launched", "failed", "cancelled"
# The provider had no capacity on that market: the job waits, free. Such a claim is not a launch
# (it does not count toward max_launches); the next try reuses it, conditional on its ETag.
NO_CAPACITY = "no_capacity"
STATUSES = (CLAIMED, LAUNCHED, FAILED, CANCELLED, NO_CAPACITY)
_FIELDS = ("uid", "n", "status", "market", "lost", "claimed_at", "controller", "updated_at", "launched", "error")
_NAME = re.compile(r"^launch-(\d{4,9})\.json$")
MAX_CLAIM_BYTES = 64 * 1024


def claims_prefix(uid: str) -> str:
    return f"{mf.job_prefix(uid)}/recovery/"


def claim_key(uid: str, n: int) -> str:
    return f"{claims_prefix(uid)}launch-{n:04d}.json"


@dataclass
class Claim:
    uid: str
    n: int
    status: str
    market: str
    lost: dict[str, Any]  # the owner whose lease lapsed: host, home_id, heartbeat
    claimed_at: float
    controller: str
    updated_at: float
    launched: str = ""
    error: str = ""
    etag: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        data = {
            "uid": self.uid,
            "n": self.n,
            "status": self.status,
            "market": self.market,
            "lost": self.lost,
            "claimed_at": self.claimed_at,
            "controller": self.controller,
            "updated_at": self.updated_at,
            "launched": self.launched,
            "error": self.error,
            **self.extra,
        }
        return json.dumps(data, indent=1, sort_keys=True).encode()

    def for_loss(self, own: dict[str, Any]) -> bool:
        """This claim was made for the lease `own` (same machine, same last heartbeat)."""
        return lost_identity(self.lost) == lost_identity(own)


def lost_identity(own: dict[str, Any]) -> tuple[str, Any]:
    return (str(own.get("home_id") or ""), own.get("heartbeat"))


def _parse(uid: str, n: int, raw: bytes, etag: Optional[str]) -> Optional[Claim]:
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("status") not in STATUSES:
        return None
    raw_lost = d.get("lost")
    lost: dict[str, Any] = raw_lost if isinstance(raw_lost, dict) else {}
    try:
        return Claim(
            uid=uid,
            n=n,
            status=str(d["status"]),
            market=str(d.get("market") or ""),
            lost={k: lost.get(k) for k in ("host", "home_id", "heartbeat")},
            claimed_at=float(d.get("claimed_at") or 0.0),
            controller=str(d.get("controller") or ""),
            updated_at=float(d.get("updated_at") or 0.0),
            launched=str(d.get("launched") or "")[:300],
            error=str(d.get("error") or "")[:1000],
            etag=etag,
            extra={k: v for k, v in d.items() if k not in _FIELDS},
        )
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=4096)
def _parse_bytes(uid: str, n: int, raw: bytes) -> Optional[Claim]:
    return _parse(uid, n, raw, None)


def _parsed(uid: str, n: int, raw: bytes, etag: Optional[str]) -> Optional[Claim]:
    """_parse, remembered by content: a controller reads every claim of every job each poll, and
    most have not changed. A copy each time: callers change the claims they hold."""
    claim = _parse_bytes(uid, n, raw)
    if claim is None:
        return None
    return _fresh(claim, etag)


def _fresh(claim: Claim, etag: Optional[str]) -> Claim:
    copy = object.__new__(Claim)
    copy.__dict__.update(claim.__dict__)
    copy.lost, copy.extra, copy.etag = dict(claim.lost), dict(claim.extra), etag
    return copy


def read_claims(remote: Remote, uid: str, cache: Optional[dict[str, Any]] = None) -> list[Claim]:
    """The job's claims, oldest first. One that cannot be read still counts as a launch (its
    number is taken), as a failed one. `cache` (a dict the caller keeps): when the listing shows
    the same objects with the same ETags as last time, the claims read then (copies), no reads."""
    listing = remote.list(claims_prefix(uid))
    seen = tuple((str(meta["path"]), meta.get("e_tag")) for meta in listing)
    if cache is not None and all(tag for _, tag in seen):
        held = cache.get(uid)
        if held is not None and held[0] == seen:
            return [_fresh(c, c.etag) for c in held[1]]
    out = _read_listed(remote, uid, listing)
    if cache is not None:
        cache[uid] = (seen, [_fresh(c, c.etag) for c in out])
    return out


def _read_listed(remote: Remote, uid: str, listing: list[Any]) -> list[Claim]:
    out: list[Claim] = []
    for meta in listing:
        name = str(meta["path"]).rsplit("/", 1)[-1]
        m = _NAME.match(name)
        if not m:
            continue
        n = int(m.group(1))
        got = remote.get_with_etag(claim_key(uid, n), max_bytes=MAX_CLAIM_BYTES)
        if got is None:
            continue
        claim = _parsed(uid, n, got[0], got[1])
        if claim is None:
            claim = Claim(uid, n, FAILED, "", {}, 0.0, "", 0.0, error="unreadable claim", etag=got[1])
        out.append(claim)
    return sorted(out, key=lambda c: c.n)


def launches(claims: list[Claim]) -> int:
    """The launches that count toward max_launches: every claim but a capacity wait."""
    return sum(1 for c in claims if c.status != NO_CAPACITY)


def put_new(remote: Remote, claim: Claim) -> Claim:
    """Create launch n: raises objectstore.remote.Conflict when another writer has it."""
    claim.etag = remote.cas_put(claim_key(claim.uid, claim.n), claim.to_json(), None)
    return claim


def update(remote: Remote, claim: Claim) -> Claim:
    """Rewrite the claim, only if it is still the version we hold (Conflict otherwise)."""
    claim.etag = remote.cas_put(claim_key(claim.uid, claim.n), claim.to_json(), claim.etag)
    return claim


def waiting_since(claims: list[Claim], manifest: dict[str, Any]) -> Optional[float]:
    """When the job started waiting for a replacement: the lapsed lease's last heartbeat, if the
    newest claim is for the lease the manifest still names."""
    own = manifest.get("owner") or {}
    if not claims or not claims[-1].for_loss(own) or claims[-1].status == CANCELLED:
        return None
    hb = own.get("heartbeat")
    return float(hb) if isinstance(hb, (int, float)) else claims[-1].claimed_at
