"""Where a Ray attempt ran, for `orch status`, `orch show` (and `--json`) and the dashboard: its
Ray submission id and the Ray node (id and host). Read from the job row (what the daemon last heard
from Ray) and the run folder (attempt-<n>.ray.json, written by the attempt's step on its node), so
it needs neither the head nor the daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..contract import attempt_exit, attempt_ray_info, ray_submission_id, read_json
from ..model.executor_kinds import RAY  # the `executor` column of a job whose attempt Ray runs
from ..model.records import Job
from ..model.states import JobState


def ray_now(job: Job) -> Optional[dict[str, Any]]:
    """A running Ray attempt's submission id, Ray's state and node, from the row alone (`orch
    status` over many jobs reads no file); None for any other job."""
    if job.executor != RAY or job.state is not JobState.RUNNING or not job.attempt:
        return None
    ref = job.executor_ref or {}
    return {
        "submission_id": str(ref.get("submission_id") or ray_submission_id(job.uid, job.attempt)),
        "state": ref.get("state") or None,
        "node_id": ref.get("node_id") or None,
    }


def ray_attempt(job: Job, run_dir: Path, n: int) -> Optional[dict[str, Any]]:
    """Attempt n's Ray job and node, or None when Ray did not run it (another executor did). A
    Ray attempt that never started (stopped while pending) has a submission id and no node."""
    info = read_json(run_dir / attempt_ray_info(n))
    current = n == job.attempt and job.executor == RAY
    if info is None and not current and "ray_status" not in (read_json(run_dir / attempt_exit(n)) or {}):
        return None
    info = info or {}
    ref = (job.executor_ref or {}) if current else {}
    return {
        "submission_id": str(ref.get("submission_id") or ray_submission_id(job.uid, n)),
        "node_id": info.get("node_id") or ref.get("node_id") or None,
        "host": info.get("host") or None,
    }


def ray_text(ray: dict[str, Any]) -> str:
    """`orch show`'s words for one attempt: "Ray orch-…-2 on node 1a2b3c4d (worker-7)"."""
    node = (ray.get("node_id") or "")[:8]
    where = f" on node {node}" if node else ""
    if ray.get("host"):
        where += f" ({ray['host']})" if node else f" on {ray['host']}"
    return f"Ray {ray['submission_id']}{where or ' (never ran on a node)'}"
