"""The Slurm tests run against a REAL private Slurm: one cluster per test session (munged,
slurmctld and two slurmd "n1"/"n2" on this host, in a temp folder, no systemd), and a real orch
daemon per test whose config says `[executor] kind = "slurm"`. Skipped, with the reason, where
Slurm cannot be installed or started (not root, no apt-get): scripts/system-deps.sh installs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401,F811  (fixture)
from orchestrator.spec.config import load_config
from slurm_cluster import SlurmCluster, why_unusable

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    why = why_unusable()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(grace=15)
    try:
        cluster.start()
    except Exception as exc:  # pragma: no cover (a machine where slurmctld cannot run)
        cluster.stop()
        pytest.skip(f"the private Slurm cluster did not start: {exc}")
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.base, ignore_errors=True)


@pytest.fixture
def slurm_home(orch_home, slurm) -> Callable[..., OrchHome]:  # noqa: F811
    """slurm_home(**slurm_keys) -> an OrchHome whose config runs attempts on the private cluster."""

    def make(daemon: dict[str, Any] | None = None, cluster: SlurmCluster | None = None, **keys: Any) -> OrchHome:
        cluster = cluster or slurm
        cluster.cancel_all()
        h = orch_home(**{"cpu_slots": 4, "grace_seconds": 20, **(daemon or {})})
        settings = {
            "slurm_conf": str(cluster.conf),
            "poll_seconds": 0.5,
            "partition": "low",
            "shared_dirs": [str(h.tmp)],
            "warn_before": 0,
            **keys,
        }
        text = (h.root / "config.toml").read_text()
        text += '\n[executor]\nkind = "slurm"\n\n[slurm]\n' + "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in settings.items()
        )
        (h.root / "config.toml").write_text(text)
        h.config = load_config(h.root / "config.toml", required=True)
        h.slurm = cluster
        local = h.diagnostics
        h.diagnostics = lambda job_id: local(job_id) + slurm_diagnostics(cluster)  # type: ignore[method-assign]
        return h

    return make


def slurm_diagnostics(cluster: SlurmCluster) -> str:
    """Slurm's view when a wait times out: every job it knows, and the controller's log tail."""
    queue = cluster.run("squeue", "-t", "all", "-o", "%i %j %T %r %N %M", check=False).stdout
    try:
        ctld = (cluster.base / "log" / "slurmctld.log").read_text(errors="replace").splitlines()[-25:]
    except OSError:
        ctld = []
    return f"\n--- squeue -t all ---\n{queue}--- slurmctld.log (tail) ---\n" + "\n".join(ctld)


def slurm_id(h: OrchHome, job_id: int) -> str:
    return wait_for(lambda: h.job(job_id).executor_ref.get("slurm_job_id"), 20, what=f"job {job_id}'s Slurm id")


def squeue_state(slurm: SlurmCluster, sid: str) -> str:
    r = slurm.run("squeue", "-h", "-t", "all", "-j", sid, "-o", "%T", check=False)
    return r.stdout.strip()


def orch_cli(h: OrchHome, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(h.root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
