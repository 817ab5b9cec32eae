"""A job's copy in the store, and its one commit point, the manifest.

    <prefix>/jobs/<uid>/manifest.json                       written last; conditional writes
    <prefix>/jobs/<uid>/checkpoints/<tag>-<name>            immutable: one key per upload, never rewritten
    <prefix>/jobs/<uid>/files/progress.json, metrics.csv, batch.json, tracking.json, result.json, attempt-N.log
    <prefix>/jobs/<uid>/files/provenance/packages.txt, system.json, diff.patch   (what the job ran with)
    <prefix>/jobs/<uid>/model/...                           the exported model, on success

A reader trusts only what the manifest names: a checkpoint uploaded after the last manifest
(or half uploaded when the machine died) is invisible to it, and retention deletes a checkpoint
only after a manifest that no longer names it has been written. The manifest carries an owner
lease (host, this ORCH_HOME's id, daemon pid, heartbeat); `orch adopt` refuses a job whose lease
is fresher than [storage] stale_after_minutes unless it was released by `orch daemon stop`."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any, Optional, Sequence

from ..contract import PROVENANCE
from ..home.paths import Home

VERSION = 1
IDENTITY_FILE = "mirror-id"  # in ORCH_HOME: which machine (home) owns a job's lease


def job_prefix(uid: str) -> str:
    return f"jobs/{uid}"


def manifest_key(uid: str) -> str:
    return f"{job_prefix(uid)}/manifest.json"


def checkpoint_key(uid: str, name: str, tag: str) -> str:
    """`tag`: 16 hex digits naming one queued upload (daemon/mirror/uploads.py), known before the
    first byte is read, so the upload starts at once and hashes as it goes; the sha256 is in the
    manifest's record of the checkpoint."""
    return f"{job_prefix(uid)}/checkpoints/{tag[:16]}-{name}"


def file_key(uid: str, name: str) -> str:
    return f"{job_prefix(uid)}/files/{name}"


def provenance_key(uid: str, name: str) -> str:
    return file_key(uid, f"{PROVENANCE}/{name}")


def model_key(uid: str, rel: str) -> str:
    return f"{job_prefix(uid)}/model/{rel}"


def home_identity(home: Home) -> str:
    """A random id for this ORCH_HOME, made once: the lease names it (a host name alone is not
    unique: a new instance may get the old one's name)."""
    path = home.root / IDENTITY_FILE
    try:
        value = path.read_text().strip()
        if value:
            return value
    except OSError:
        pass
    value = uuid.uuid4().hex
    home.root.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{IDENTITY_FILE}.{os.getpid()}.tmp")
    tmp.write_text(value + "\n")
    try:
        os.link(tmp, path)  # first writer wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_text().strip()


def owner(
    home_id: str,
    *,
    now: Optional[float] = None,
    released: bool = False,
    by: str = "daemon",
    instance_id: Optional[str] = None,
) -> dict[str, Any]:
    """The lease. `instance_id`: the cloud's id of this machine where the daemon knows it (EC2), so
    `orch watch` can ask the cloud whether a silent owner is really gone."""
    lease = {
        "host": socket.gethostname(),
        "home_id": home_id,
        "pid": os.getpid(),
        "by": by,
        "heartbeat": time.time() if now is None else now,
        "released": released,
    }
    if instance_id:
        lease["instance_id"] = instance_id
    return lease


def lease_age(manifest: dict[str, Any], now: float) -> Optional[float]:
    hb = (manifest.get("owner") or {}).get("heartbeat")
    return None if not isinstance(hb, (int, float)) else max(0.0, now - hb)


def lease_holder(manifest: dict[str, Any], now: float, stale_after_s: float) -> Optional[str]:
    """Who still holds the job ("host X, heartbeat 2 min ago"), or None when it is free: released by a
    clean stop, or its heartbeat older than stale_after_s."""
    own = manifest.get("owner") or {}
    if own.get("released"):
        return None
    age = lease_age(manifest, now)
    if age is None or age >= stale_after_s:
        return None
    return f"host {own.get('host') or '?'} (its heartbeat is {_age(age)} old; stale after {_age(stale_after_s)})"


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def build_manifest(
    job: Any,
    attempts: Sequence[Any],
    *,
    home_id: str,
    checkpoints: list[dict[str, Any]],
    batch: Optional[dict[str, Any]],
    progress: Optional[dict[str, Any]],
    result: Optional[dict[str, Any]] = None,
    model: Optional[list[str]] = None,
    data_files: Optional[list[dict[str, Any]]] = None,
    provenance: Optional[list[str]] = None,
    released: bool = False,
    now: Optional[float] = None,
    machines: Optional[list[dict[str, Any]]] = None,
    instance_id: Optional[str] = None,
) -> dict[str, Any]:
    """Everything another machine needs to take the job over (jobs.uid is its name)."""
    now = time.time() if now is None else now
    return {
        "version": VERSION,
        "uid": job.uid,
        "local_id": job.id,
        "name": job.name,
        "state": job.state.value,
        "reason": job.reason,
        "kind": job.kind,
        "gpus": job.gpus,
        "priority": job.priority,
        "retries": job.retries,
        "failures": job.failures,
        "attempt": job.attempt,
        "spec": job.spec,
        "spec_path": job.spec_path,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "git": {"commit": job.git_commit, "dirty": job.git_dirty},
        "budget": {"max_cost": job.max_cost, "max_hours": job.max_hours},
        "cost": {
            "cost": job.cost,
            "run_seconds": job.run_seconds,
            "gpu_seconds": job.gpu_seconds,
            "waste_seconds": job.waste_seconds,
            "waste_cost": job.waste_cost,
            "steps_lost": job.steps_lost,
        },
        "attempts": [
            {
                "n": a.n,
                "started_at": a.started_at,
                "ended_at": a.ended_at,
                "gpu_ids": a.gpu_ids,
                "exit_code": a.exit_code,
                "exit_signal": a.exit_signal,
                "outcome": a.outcome.value,
                "resumed_from_step": a.resumed_from_step,
                "step_reached": a.step_reached,
            }
            for a in attempts
        ],
        "batch": batch,
        "progress": progress,
        "checkpoints": checkpoints,  # newest first; only complete uploads, each with sha256 and size
        "result": result,
        "model": model,
        "data_files": data_files or [],
        "provenance": provenance or [],  # files/provenance/<name>, uploaded before this manifest
        "machines": machines or [],  # every machine the job ran on (machines.py)
        "owner": owner(home_id, now=now, released=released, instance_id=instance_id),
        "written_at": now,
    }


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{where}: not a JSON manifest ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("uid"), str):
        raise ValueError(f"{where}: not an orch manifest (no uid)")
    # The daemon reads only the version and the owner lease here (adopt checks everything:
    # manifest_model.py); whoever writes the store may have put anything in them.
    version, own = data.get("version") or 0, data.get("owner")
    if not isinstance(version, int) or (own is not None and not isinstance(own, dict)):
        raise ValueError(f"{where}: not an orch manifest (version or owner of the wrong type)")
    if version > VERSION:
        raise ValueError(f"{where}: written by a newer orch (manifest version {data.get('version')}); upgrade orch")
    return data


def dump(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=1, sort_keys=True, default=str).encode()


def newest_step(manifest: dict[str, Any]) -> Optional[int]:
    ck = manifest.get("checkpoints") or []
    return ck[0].get("step") if ck else None


def furthest_step(manifest: dict[str, Any]) -> Optional[int]:
    """The furthest step the owner's running attempt is known to have reached: its mirrored
    progress, its attempt record, or its newest mirrored checkpoint (a checkpoint proves its step).
    The adopted attempt and the closed machine entry both say this one number."""
    progress = manifest.get("progress")
    progress = progress if isinstance(progress, dict) else {}
    attempts = manifest.get("attempts") or []
    last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
    steps = [
        s
        for s in (progress.get("step"), last.get("step_reached"), newest_step(manifest))
        if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**63
    ]
    return max(steps) if steps else None
