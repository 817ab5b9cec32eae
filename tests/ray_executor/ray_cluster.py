"""A real Ray cluster on this host for the Ray executor's tests: a head (no GPUs, the dashboard and
its Jobs API on loopback) and worker nodes with one fake GPU each (`ray start --num-gpus 1`), each
node its own `ray start --block` process in its own session, so one node can be lost (its raylet
`kill -9`ed) or stopped without touching the others. Small on purpose: one CPU a node."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

RAY = Path(sys.executable).with_name("ray")
# Ray's fixed default ports (52365, ...) are one per host: the head gets its own, or another
# session's cluster here leaves it without its job agent ("No available agent to submit job").
# (A worker's agent on a host that already has one goes without: jobs are submitted to the head's.)
OWN_PORTS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


def why_unusable() -> Optional[str]:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'orch-gpu[ray]', or the test extra)"
    if not RAY.exists():
        return f"the ray command is not beside this Python ({RAY})"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, name) of the direct children of pid."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == pid:
            out.append((int(entry), name))
    return out


def descendants(pid: int) -> list[int]:
    """Every process under pid, at any depth (a new session does not take a process out of it)."""
    found, todo = [], [pid]
    while todo:
        kids = [child for child, _ in children(todo.pop())]
        found += kids
        todo += kids
    return found


class RayCluster:
    def __init__(self, *, fast_loss_detection: bool = True) -> None:
        # A short folder: Ray's unix sockets live under it (a path over 107 bytes cannot be bound).
        self.base = Path(tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp"))
        self.port = free_port()
        self.dashboard_port = free_port()
        self.client_port = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.head: Optional[subprocess.Popen] = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
        }
        if fast_loss_detection:
            # A lost node is seen in ~5 s, not Ray's default ~15 s (a check a second, 5 refused in
            # a row; each still waits Ray's 10 s for a starved raylet, so a loaded host does not
            # fail a healthy node). The benchmark keeps Ray's defaults: its figures are what a
            # user's cluster does.
            self.env.update(
                RAY_health_check_period_ms="1000",
                RAY_health_check_failure_threshold="5",
            )
        self.env.pop("RAY_ADDRESS", None)

    def _start(self, args: list[str], log: str) -> subprocess.Popen:
        out = open(self.base / log, "ab")
        return subprocess.Popen(
            [str(RAY), "start", "--block", "--disable-usage-stats", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )

    def start(self, workers: int = 2) -> None:
        self.start_head()
        self.add_workers([f"w{i + 1}" for i in range(workers)])

    def ensure(self, workers: int = 2) -> None:
        """The head and the workers a test expects, started again where an earlier test stopped
        or lost them (replaced by the next test that needs them, not by the test that lost them:
        the last test of a session then pays for nothing it does not use)."""
        if self.head is None or self.head.poll() is not None:
            self.head = None
            self.start_head()
        for name in [n for n, proc in self.workers.items() if proc.poll() is not None]:
            self._stop(self.workers.pop(name))
        free = (f"w{i}" for i in range(1, 100) if f"w{i}" not in self.workers)
        missing = [next(free) for _ in range(workers - len(self.workers))]
        if missing:
            self.add_workers(missing)

    def start_head(self) -> None:
        """The head, at the same ports every time (a restarted head keeps its address)."""
        self.head = self._start(
            [
                "--head",
                f"--port={self.port}",
                "--num-cpus=1",
                "--num-gpus=0",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={self.client_port}",
                *(f"--{flag}={free_port()}" for flag in OWN_PORTS),
                f"--temp-dir={self.base / 't'}",
            ],
            "head.log",
        )
        self.wait(lambda: self._get("/api/version") is not None, 300, "the Ray head's dashboard")
        # jobs are submitted through the head's agent: wait until it listens
        self.wait(self._agent_up, 300, "the Ray head's job agent")
        # orch dispatches from the GPU figures of the autoscaler monitor: wait for its first report
        self.wait(
            lambda: ((self._get("/api/cluster_status") or {}).get("data") or {}).get("clusterStatus"),
            300,
            "the head's cluster status",
        )

    def _agent_up(self) -> bool:
        data = self._get("/nodes?view=summary") or {}
        heads = [n.get("raylet") or {} for n in (data.get("data") or {}).get("summary") or []]
        return any(r.get("isHeadNode") and (r.get("dashboardAgentListenPort") or -1) > 0 for r in heads)

    def add_worker(self, name: str) -> None:
        self.add_workers([name])

    def add_workers(self, names: list[str]) -> None:
        """One after the other: two `ray start`s on one host at once race for the same node ports,
        and one of them times out in its start-up."""
        for name in names:
            self.workers[name] = self._start(
                [f"--address=127.0.0.1:{self.port}", "--num-cpus=1", "--num-gpus=1", f'--resources={{"{name}": 1}}'],
                f"{name}.log",
            )
            self.wait(lambda: name in self.joined(), 300, f"worker {name} to join")

    def joined(self) -> set[str]:
        """The names of the live GPU workers (by their custom resource)."""
        return {k for n in self.gpu_nodes() for k in (n.get("resourcesTotal") or {}) if k in self.workers}

    def raylet(self, name: str) -> int:
        return self.raylet_of(self.workers[name], name)

    @staticmethod
    def raylet_of(proc: subprocess.Popen, name: str) -> int:
        found = [pid for pid, comm in children(proc.pid) if comm == "raylet"]
        assert found, f"no raylet under worker {name} (pid {proc.pid}): {children(proc.pid)}"
        return found[0]

    def lose_worker(self, name: str) -> None:
        """The machine is lost: its raylet and every process under it (the job's supervisor, the
        job itself) killed outright at once, as a dead machine's are. Killing the raylet alone
        leaves the job training on as an orphan for the 10-15 s Ray takes to notice, which on one
        host can carry a short job to its end before the loss is seen."""
        proc = self.workers.pop(name)
        raylets = [pid for pid, comm in children(proc.pid) if comm == "raylet"]  # none: it died on its own
        for pid in [*raylets, *(d for r in raylets for d in descendants(r))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._stop(proc)

    def _get(self, path: str) -> Optional[dict]:
        try:
            with urllib.request.urlopen(self.address + path, timeout=5) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def gpu_nodes(self) -> list[dict]:
        data = self._get("/nodes?view=summary") or {}
        nodes = [n.get("raylet") or {} for n in (data.get("data") or {}).get("summary") or []]
        return [n for n in nodes if n.get("state") == "ALIVE" and (n.get("resourcesTotal") or {}).get("GPU")]

    def node_of(self, node_id: str) -> Optional[str]:
        """Which worker name holds a Ray node id (by its custom resource)."""
        data = self._get("/nodes?view=summary") or {}
        for n in (data.get("data") or {}).get("summary") or []:
            raylet = n.get("raylet") or {}
            if raylet.get("nodeId") == node_id:
                return next((k for k in (raylet.get("resourcesTotal") or {}) if k in self.workers), None)
        return None

    @staticmethod
    def wait(predicate, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # and anything of the node left in its session
        except OSError:
            pass
        proc.wait(10)

    def stop_head(self) -> None:
        if self.head is not None:
            self._stop(self.head)
            self.head = None

    def stop(self) -> None:
        for name in list(self.workers):
            self._stop(self.workers.pop(name))
        self.stop_head()
        shutil.rmtree(self.base, ignore_errors=True)
