"""A Ray node marked draining (GcsNodeInfo.state_snapshot = DRAINING: Ray's autoscaler draining a
spot node it was told will be preempted, or `ray drain-node`) is a notice for the attempts running
on it (executors/ray/watch.drain_notices), read from the dashboard's node summary in the shape Ray
2.60 answers. Tested on that mapping alone: on a one-host test cluster Ray's dashboard keeps the
summary it read when each node joined, so a drain (`ray drain-node`, tried) never shows there."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.executors.ray.api import RayJob, RayNode
from orchestrator.executors.ray.watch import drain_notices

W1, W2 = "137ee1a0" + "68" * 24, "757e18cf" + "8a" * 24


def summary_entry(node_id: str, *, state: str = "ALIVE", snapshot: str | None = "ACTIVE") -> dict[str, Any]:
    """One entry of `/nodes?view=summary`'s data.summary, trimmed from a real Ray 2.60 answer."""
    raylet: dict[str, Any] = {
        "nodeId": node_id,
        "nodeManagerAddress": "192.0.2.2",
        "resourcesTotal": {"GPU": 1.0, "CPU": 1.0},
        "state": state,
        "isHeadNode": False,
        "stateMessage": None,
    }
    if snapshot is not None:
        raylet["stateSnapshot"] = {"state": snapshot, "idleDurationMs": "0", "nodeActivity": []}
    return {"ip": "192.0.2.2", "raylet": raylet}


def running_on(node_id: str, sid: str) -> RayJob:
    return RayJob.from_json({"submission_id": sid, "status": "RUNNING", "driver_node_id": node_id})


@pytest.mark.parametrize(
    ("entry", "draining"),
    [
        (summary_entry(W1, snapshot="DRAINING"), True),
        (summary_entry(W1, snapshot="ACTIVE"), False),
        (summary_entry(W1, snapshot="IDLE"), False),
        (summary_entry(W1, snapshot=None), False),  # an older Ray: no snapshot, never a notice
        (summary_entry(W1, state="DEAD", snapshot="DRAINING"), False),  # gone: the attempt is lost instead
    ],
)
def test_a_node_is_draining_only_when_alive_and_its_snapshot_says_so(entry, draining):
    node = RayNode.from_summary(entry)
    assert node.node_id == W1 and node.gpus == 1.0
    assert node.draining is draining


def test_only_the_attempts_on_a_draining_node_get_the_notice():
    nodes = [RayNode.from_summary(summary_entry(W1, snapshot="DRAINING")), RayNode.from_summary(summary_entry(W2))]
    running = {"orch-a-1": running_on(W1, "orch-a-1"), "orch-b-1": running_on(W2, "orch-b-1")}
    notices = drain_notices(running, nodes)
    assert list(notices) == ["orch-a-1"]
    assert "137ee1a0 (192.0.2.2) is draining" in notices["orch-a-1"] and "preemption" in notices["orch-a-1"]
    assert drain_notices(running, [RayNode.from_summary(summary_entry(W1)), nodes[1]]) == {}
