"""The Ray executor's tests run against a REAL Ray cluster on this host (ray_cluster.py: a head and
two worker nodes with one fake GPU each), started once for all of them (Ray takes most of a minute
to start on two busy cores) and stopped after them, and a
real orch daemon per test whose config says `[executor] kind = "ray"`. Skipped, with the reason,
where ray is not installed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401,F811  (fixture)
from orchestrator.home.wake import poke
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.planning.capacity import gpu_slots
from orchestrator.spec.config import load_config
from ray_cluster import RayCluster, why_unusable

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


# The tests that take nodes away run last, the most destructive last of all: each test gets the
# nodes it needs (RayCluster.ensure), but in this order no node is ever started twice.
LAST = ("test_a_preemption_notice", "test_a_worker_lost", "test_the_head_stopped")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every Ray test on one xdist worker (`--dist loadgroup`): the cluster is one per host and
    per session, and two of them on two cores would starve each other."""
    ours = [i for i, item in enumerate(items) if HERE in Path(str(item.path)).parents]
    for i in ours:
        items[i].add_marker(pytest.mark.xdist_group("ray"))
        items[i].add_marker(pytest.mark.slow)

    def rank(item: pytest.Item) -> int:
        return next((n + 1 for n, prefix in enumerate(LAST) if item.name.startswith(prefix)), 0)

    for i, item in zip(ours, sorted((items[i] for i in ours), key=rank)):
        items[i] = item


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    why = why_unusable()
    if why:
        pytest.skip(why)
    cluster = RayCluster()
    try:
        cluster.start(workers=2)
    except Exception as exc:  # pragma: no cover (a machine where Ray cannot start)
        cluster.stop()
        pytest.skip(f"the Ray cluster on this host did not start: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture
def ray_home(orch_home, ray_cluster) -> Callable[..., OrchHome]:  # noqa: F811
    """ray_home(**ray_keys) -> an OrchHome whose config runs attempts on the module's cluster."""

    def make(daemon: dict[str, Any] | None = None, workers: int = 2, **keys: Any) -> OrchHome:
        ray_cluster.ensure(workers)  # nodes an earlier test took away, started again
        h = orch_home(**{"grace_seconds": 10, **(daemon or {})})
        settings = {"address": ray_cluster.address, "poll_seconds": 0.5, **keys}
        text = (h.root / "config.toml").read_text()
        text += '\n[executor]\nkind = "ray"\n\n[ray]\n' + "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in settings.items()
        )
        (h.root / "config.toml").write_text(text)
        h.config = load_config(h.root / "config.toml", required=True)
        h.ray = ray_cluster
        return h

    return make


def submit(h: OrchHome, path: Path) -> int:
    """What `orch submit` does, in-process, sized as the CLI sizes a Ray daemon's GPUs."""
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=len(gpu_slots(h.config)))
    poke(h.home.wake_socket)
    return job.id


def ray_state(h: OrchHome, job_id: int) -> str:
    return str(h.job(job_id).executor_ref.get("state") or "")


def wait_ray_state(h: OrchHome, job_id: int, state: str, timeout: float = 60.0) -> dict[str, Any]:
    wait_for(
        lambda: ray_state(h, job_id) == state,
        timeout,
        what=lambda: f"job {job_id} to be {state} in Ray (it is {h.job(job_id).executor_ref}); {h.log_tail(20)}",
    )
    return h.job(job_id).executor_ref
