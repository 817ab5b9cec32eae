"""Ray's Jobs REST API on the head's dashboard (`/api/jobs/`), spoken over HTTP with the standard
library: the daemon never imports `ray` (a heavy package that would slow every tick's process and
tie orch to one Ray version), and it needs no `ray` installed where it runs. Every call either
answers or raises RayUnreachable: "cannot tell" is never read as an ending."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from ...model.errors import OrchError

# The job's states as Ray names them (ray.job_submission.JobStatus).
PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED = "PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"
TERMINAL = frozenset({STOPPED, SUCCEEDED, FAILED})

# Ray's error types that mean the machine (or Ray on it) went away under the job, not the job's own
# failure: the attempt is lost, requeued and resumed, not charged to `retries`.
MACHINE_LOST_ERRORS = frozenset({"JOB_SUPERVISOR_ACTOR_DIED", "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE"})
# Ray gave up waiting for resources (RAY_JOB_START_TIMEOUT_SECONDS, 900 s by default): requeued too.
START_TIMEOUT_ERRORS = frozenset({"JOB_SUPERVISOR_ACTOR_START_TIMEOUT"})


class RayUnreachable(OrchError, OSError):
    """The head did not answer (down, restarting, a wrong address): unknown, not an ending."""


class RayRefused(OrchError, OSError):
    """The head answered with an error about this request (HTTP 4xx: a bad runtime_env, say). An
    HTTP 5xx is the head's own trouble (its job agent not up yet, say): RayUnreachable, retried."""


@dataclass(frozen=True)
class RayJob:
    submission_id: str
    status: str
    error_type: str = ""
    message: str = ""
    driver_node_id: str = ""
    driver_exit_code: Optional[int] = None
    start_time: Optional[float] = None  # Unix seconds (Ray gives milliseconds)
    end_time: Optional[float] = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RayJob":
        def seconds(ms: Any) -> Optional[float]:
            return float(ms) / 1000.0 if isinstance(ms, (int, float)) and ms > 0 else None

        return cls(
            submission_id=str(d.get("submission_id") or ""),
            status=str(d.get("status") or ""),
            error_type=str(d.get("error_type") or ""),
            message=str(d.get("message") or ""),
            driver_node_id=str(d.get("driver_node_id") or ""),
            driver_exit_code=d.get("driver_exit_code") if isinstance(d.get("driver_exit_code"), int) else None,
            start_time=seconds(d.get("start_time")),
            end_time=seconds(d.get("end_time")),
        )

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL

    @property
    def machine_lost(self) -> bool:
        """Ray lost the process's node or its supervisor (not the job's own exit)."""
        if self.status != FAILED:
            return False
        text = self.message.lower()
        return (
            self.error_type in MACHINE_LOST_ERRORS
            or self.error_type in START_TIMEOUT_ERRORS
            or ("node" in text and ("died" in text or "dead" in text))
        )


# GcsNodeInfo.state_snapshot.state: what the node's raylet last reported (IDLE, ACTIVE, DRAINING).
# DRAINING: Ray was asked to drain it (its autoscaler for a spot preemption or an idle node, or
# `ray drain-node`); it takes no new work and goes away when what runs on it ends, or at the
# drain's deadline.
DRAINING = "DRAINING"


@dataclass(frozen=True)
class RayNode:
    node_id: str
    address: str
    alive: bool
    gpus: float
    draining: bool = False

    @classmethod
    def from_summary(cls, entry: dict[str, Any]) -> "RayNode":
        """One node of the dashboard's `/nodes?view=summary` (its `raylet` part)."""
        raylet = entry.get("raylet") or {}
        return cls(
            node_id=str(raylet.get("nodeId") or ""),
            address=str(raylet.get("nodeManagerAddress") or entry.get("ip") or ""),
            alive=raylet.get("state") == "ALIVE",
            gpus=float((raylet.get("resourcesTotal") or {}).get("GPU") or 0),
            draining=raylet.get("state") == "ALIVE" and (raylet.get("stateSnapshot") or {}).get("state") == DRAINING,
        )


# A submit waits longer than a look: under load the head takes many seconds to create the job's
# supervisor actor before it answers, and a submit given up on early may still have been taken.
SUBMIT_TIMEOUT_S = 60.0


class RayJobsApi:
    def __init__(self, address: str, timeout_s: float = 10.0, submit_timeout_s: float = SUBMIT_TIMEOUT_S):
        self.address = address.rstrip("/")
        self.timeout_s = timeout_s
        self.submit_timeout_s = max(submit_timeout_s, timeout_s)

    def _call(
        self, method: str, path: str, body: Optional[dict[str, Any]] = None, timeout_s: Optional[float] = None
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.address + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                text = resp.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace").strip().splitlines()
            said = (detail or [""])[-1][:300]
            if exc.code >= 500:  # the head's own trouble ("No available agent ... try again later"): not a no
                raise RayUnreachable(
                    f"the Ray head at {self.address} cannot answer {method} {path} now: HTTP {exc.code}: {said}"
                ) from None
            raise RayRefused(f"the Ray head refused {method} {path}: HTTP {exc.code}: {said}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RayUnreachable(f"the Ray head at {self.address} does not answer ({reason})") from None
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            raise RayUnreachable(f"{self.address} answered {path} with something that is not Ray's JSON") from None

    def submit(self, body: dict[str, Any]) -> str:
        """POST a job; returns its submission id. Idempotent by the submission id: a job Ray
        already has under it (a retried submit whose first answer was lost, or came too late) is
        that same job, adopted, never a second one. RayUnreachable only when Ray does not have it
        (or cannot say): the caller sends the same body again later."""
        sid = str(body["submission_id"])
        try:
            answer = self._call("POST", "/api/jobs/", body, timeout_s=self.submit_timeout_s)
        except RayRefused as exc:
            if "already exists" in str(exc) and self.job(sid) is not None:
                return sid
            raise
        except RayUnreachable:
            # No answer in time: the head may have taken it all the same. Look before saying no.
            try:
                if self.job(sid) is not None:
                    return sid
            except OSError:
                pass
            raise
        return str((answer or {}).get("submission_id") or sid)

    def jobs(self) -> dict[str, RayJob]:
        """Every job the cluster knows, by submission id: one request per poll for all attempts."""
        answer = self._call("GET", "/api/jobs/")
        return {j.submission_id: j for j in (RayJob.from_json(d) for d in answer or []) if j.submission_id}

    def job(self, submission_id: str) -> Optional[RayJob]:
        try:
            return RayJob.from_json(self._call("GET", f"/api/jobs/{submission_id}") or {})
        except RayRefused as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def stop(self, submission_id: str) -> bool:
        answer = self._call("POST", f"/api/jobs/{submission_id}/stop")
        return bool((answer or {}).get("stopped"))

    def gpu_usage(self) -> Optional[tuple[float, float]]:
        """(GPUs in use, GPUs in all) over the cluster's live nodes, as Ray's autoscaler monitor last
        reported them (`ray status`'s figures, refreshed every few seconds); None before its first
        report (a head just started)."""
        answer = self._call("GET", "/api/cluster_status") or {}
        report = ((answer.get("data") or {}).get("clusterStatus") or {}).get("loadMetricsReport")
        if not isinstance(report, dict):
            return None
        gpu = (report.get("usage") or {}).get("GPU") or [0.0, 0.0]
        try:
            return float(gpu[0]), float(gpu[1])
        except (TypeError, ValueError, IndexError):
            return None

    def nodes(self) -> list[RayNode]:
        """The cluster's nodes with their GPUs (the dashboard's node summary)."""
        answer = self._call("GET", "/nodes?view=summary") or {}
        return [RayNode.from_summary(n) for n in (answer.get("data") or {}).get("summary") or [] if isinstance(n, dict)]
