"""The machines a job ran on, carried in its manifest (`machines`) from owner to owner, so the
bill and `orch show` follow the job across adoptions: host, market (and zone), from–to, first and last step.
The last entry is the current owner's; each adopting machine closes the previous one and appends
its own (the market from the newest launch claim `orch watch` wrote for it)."""

from __future__ import annotations

import socket
from typing import Any, Optional

from .manifest import furthest_step

MAX_MACHINES = 1000


def _step(progress: Optional[dict[str, Any]]) -> Optional[int]:
    step = (progress or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def entry(home_id: str, *, market: str, since: float, first_step: Optional[int], zone: str = "") -> dict[str, Any]:
    out = {
        "host": socket.gethostname(),
        "home_id": home_id,
        "market": market,
        "from": since,
        "to": since,
        "first_step": first_step,
        "last_step": first_step,
    }
    if zone:  # the [[recovery.zones]] zone orch watch launched it in
        out["zone"] = zone
    return out


def current(
    machines: list[dict[str, Any]], home_id: str, *, now: float, progress: Optional[dict[str, Any]], since: float
) -> list[dict[str, Any]]:
    """The list with this machine's entry (the last) brought up to now; a first entry when the job
    started here."""
    out = [dict(m) for m in machines][-MAX_MACHINES:]
    if not out or out[-1].get("home_id") != home_id:
        out.append(entry(home_id, market="", since=since, first_step=0))
    last = out[-1]
    last["to"] = now
    step = _step(progress)
    if step is not None:
        last["last_step"] = step
    return out


def on_adopt(
    manifest: dict[str, Any], home_id: str, *, market: str, now: float, step: Optional[int], zone: str = ""
) -> list[dict[str, Any]]:
    """At adoption: the old machines (the previous owner's entry closed at its last heartbeat and
    step; made from its owner record when an older orch wrote no list) plus this one."""
    out = [dict(m) for m in manifest.get("machines") or []][-MAX_MACHINES:]
    own = manifest.get("owner") or {}
    hb = own.get("heartbeat") if isinstance(own.get("heartbeat"), (int, float)) else None
    # The same furthest step the adopted attempt records as reached: one number, not two
    last_step = furthest_step(manifest)
    if own.get("home_id") and (not out or out[-1].get("home_id") != own.get("home_id")):
        started = manifest.get("started_at") or manifest.get("submitted_at") or hb or now
        out.append(
            {
                "host": own.get("host") or "",
                "home_id": own.get("home_id"),
                "market": "",
                "from": started,
                "to": hb or started,
                "first_step": out[-1].get("last_step") if out else 0,
                "last_step": last_step,
            }
        )
    elif out:
        if hb is not None:
            out[-1]["to"] = max(float(out[-1].get("to") or 0), hb)
        if last_step is not None:
            out[-1]["last_step"] = last_step
    out.append(entry(home_id, market=market, since=now, first_step=step, zone=zone))
    return out
