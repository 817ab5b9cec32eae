"""`orch status --url URL`'s rows: the bucket's jobs, from anywhere (a laptop with no GPU machine):
each job's state, the market and machine it is on (or waits for), and its progress, read by the
controller's own rules (deciding.current_market), and the machines every `orch watch` launched.
Read-only: a listing and a few small reads per job, nothing written. The CLI prints them."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from ..objectstore import claims as cl
from ..objectstore import manifest as mf
from ..objectstore import moves, signing
from ..objectstore.manifest_model import MAX_MANIFEST_BYTES, ManifestError
from ..objectstore.manifest_model import parse as parse_manifest
from ..objectstore.remote import Remote
from ..model.markets import ON_DEMAND, SPOT
from .deciding import current_market
from .ledger import read_bucket_ledgers


@dataclass(frozen=True)
class BucketStatus:
    url: str
    rows: list[dict[str, Any]]
    machines: list[dict[str, Any]]  # every controller's ledger records (recovery/ledger.py)
    notes: list[str]

    def rows_with_machines(self) -> list[dict[str, Any]]:
        """The rows for --json: each job's machines, by id and state (the ledger's records in full
        are the table's second part)."""
        keep = ("instance_id", "state", "market", "zone", "cost", "stop_error")
        return [
            {
                **row,
                "machines": [{k: m.get(k) for k in keep} for m in self.machines if row["uid"] in (m.get("jobs") or [])],
            }
            for row in self.rows
        ]


def bucket_status(section: Any) -> BucketStatus:
    """The bucket's jobs and machines (`section`: [storage], or --url's), with the bucket key
    where [storage] names one."""
    remote = Remote(section)
    rows = bucket_rows(remote, time.time(), section.stale_after_minutes * 60, signing.keys_from(section, os.environ))
    machines, notes = read_bucket_ledgers(remote)
    return BucketStatus(url=remote.url.raw, rows=rows, machines=machines, notes=notes)


def bucket_rows(
    remote: Remote, now: float, stale_after_s: float, keys: Optional[signing.Keys] = None
) -> list[dict[str, Any]]:
    """One row per job. With the bucket key (`keys`), a job whose manifest does not verify says so:
    `orch watch` will not launch it, and `orch adopt` will not adopt it."""
    rows = []
    for uid in sorted(remote.list_dirs("jobs")):
        key = mf.manifest_key(uid)
        got = remote.get_with_etag(key, max_bytes=MAX_MANIFEST_BYTES)
        if got is None:
            continue
        try:
            m = parse_manifest(got[0], remote.where(key), uid)
        except ManifestError as exc:
            rows.append({"uid": uid, "name": "?", "state": "unreadable", "market": "", "machine": "", "note": str(exc)})
            continue
        row = _row(remote, uid, m, now, stale_after_s)
        problem = signing.problem(json.loads(got[0]), keys) if keys is not None else None
        if problem:
            row["note"] = f"not trusted (never launched or adopted): {problem}" + (
                f"; {row['note']}" if row["note"] else ""
            )
        rows.append(row)
    return rows


def _row(remote: Remote, uid: str, m: dict[str, Any], now: float, stale_after_s: float) -> dict[str, Any]:
    own = m.get("owner") or {}
    claims = cl.read_claims(remote, uid)
    launched = [c for c in claims if c.status == cl.LAUNCHED]
    latest = claims[-1] if claims else None
    market = holder_market(m, claims) or (launched[-1].market if launched and not _held(own) else "")
    progress = m.get("progress") or {}
    step, total = progress.get("step"), progress.get("total_steps")
    machine, note = _machine(own, now, stale_after_s), ""
    if m.get("state") in ("queued", "running") and machine.endswith("(no lease)"):
        if latest is not None and latest.status == cl.NO_CAPACITY:
            note = f"waits for {latest.market} capacity (free) since {_hms(latest.extra.get('capacity_since'))}"
        elif latest is not None and latest.status == cl.CLAIMED:
            note = f"launch {latest.n} on {latest.market} in progress since {_hms(latest.claimed_at)}"
        elif latest is not None and latest.status == cl.FAILED:
            note = f"launch {latest.n} failed: {latest.error[:120]}"
        elif latest is not None and latest.status == cl.LAUNCHED:
            note = f"launch {latest.n} on {latest.market} coming up: {latest.launched}"
        else:
            note = "waits for `orch watch` to place it"
    move = moves.read(remote, uid) if m.get("state") in ("queued", "running") else None
    if move is not None and move.status in (moves.ASKED, moves.HANDED_OVER, moves.LAUNCHED):
        note = (note + "; " if note else "") + f"moving to {move.to} ({move.status}): {move.why[:120]}"
    return {
        "uid": uid,
        "name": str(m.get("name") or ""),
        "state": str(m.get("state") or ""),
        "market": market,
        "machine": machine,
        "launches": cl.launches(claims),
        "progress": f"{step}/{total}" if isinstance(step, int) and isinstance(total, int) else "",
        "cost": (m.get("cost") or {}).get("cost"),
        "note": note,
    }


def _held(own: dict[str, Any]) -> bool:
    return bool(own.get("home_id")) and not own.get("released")


def holder_market(m: dict[str, Any], claims: list[cl.Claim]) -> str:
    """The market of the machine holding the lease: what it recorded when it adopted (its entry in
    the manifest's machines), else the launch its lease names -- not the newest launch, which may
    be a planned move's new machine still coming up. "" when no machine holds the job or none is known."""
    own = m.get("owner") or {}
    if not _held(own):
        return ""
    for entry in reversed(m.get("machines") or []):
        if isinstance(entry, dict) and entry.get("home_id") == own.get("home_id") and entry.get("market"):
            return str(entry["market"])
    market = current_market(claims, own)
    return market if market in (SPOT, ON_DEMAND) else ""


def _machine(own: dict[str, Any], now: float, stale_after_s: float) -> str:
    name = str(own.get("instance_id") or own.get("host") or "")
    hb = own.get("heartbeat")
    if not own.get("home_id") or not isinstance(hb, (int, float)):
        return "(no lease)"
    if own.get("released"):
        return f"{name} (released)"
    age = now - hb
    return f"{name} (heartbeat {age:.0f} s ago)" if age < stale_after_s else f"{name} silent {age:.0f} s (no lease)"


def _hms(ts: Optional[float]) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if isinstance(ts, (int, float)) else "?"
