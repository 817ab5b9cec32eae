"""`orch watch`'s controller with the `aws` provider against moto's EC2 on loopback: a silent lease
whose instance still runs is left alone; once EC2 says it is terminated, the job is lost, a launch
from a template that does not exist yet fails (`relaunch_failed`), the controller backs off, and
the next launch brings up a spot instance tagged with the job; after `on_demand_after` losses the
next one is on-demand. Real controller, real file:// mirror, real EC2 API server."""

from __future__ import annotations

import base64
import importlib.util
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
from bucket_key import KEYS, signed
from ec2_server import Ec2Server, ec2_server_running

pytest.importorskip("boto3")
if importlib.util.find_spec("orchestrator.recovery.controller") is None:  # a branch without `orch watch` yet
    pytest.skip("the recovery controller is not in this tree", allow_module_level=True)

from orchestrator.spec.config import StorageSection, load_config  # noqa: E402
from orchestrator.objectstore import claims as cl  # noqa: E402
from orchestrator.objectstore import manifest as mf  # noqa: E402
from orchestrator.objectstore.remote import Remote  # noqa: E402
from orchestrator.recovery import controller as controller_module  # noqa: E402
from orchestrator.recovery.build import build_provider  # noqa: E402
from orchestrator.store import Store  # noqa: E402

UID = "a1b2c3d4e5f60718293a4b5c6d7e8f90"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def ec2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ec2Server]:
    with ec2_server_running(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def ec2(ec2_server: Ec2Server) -> Any:
    import boto3

    return boto3.client("ec2", region_name="us-east-1", endpoint_url=ec2_server.endpoint)


def _running_instance(ec2: Any) -> str:
    reply = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g5.xlarge")
    return str(reply["Instances"][0]["InstanceId"])


def _put_manifest(remote: Remote, heartbeat: float, instance_id: str) -> None:
    m = {
        "version": 1,
        "uid": UID,
        "name": "tiny",
        "state": "running",
        "gpus": 1,
        "spec": {"name": "tiny", "command": ["true"]},
        "owner": {
            "host": "ip-10-0-0-7",
            "home_id": f"home-{instance_id}",
            "pid": 1,
            "by": "daemon",
            "heartbeat": heartbeat,
            "instance_id": instance_id,
        },
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "budget": {},
    }
    got = remote.get_with_etag(mf.manifest_key(UID))
    remote.cas_put(mf.manifest_key(UID), mf.dump(signed(m)), got[1] if got else None)


def _controller(tmp_path: Path, url: str, endpoint: str, clock: Clock) -> Any:
    cfg = tmp_path / "config.toml"
    recovery = {
        "provider": "aws",
        "poll_seconds": 10.0,
        "on_demand_after": 2,
        "aws": {"region": "us-east-1", "launch_template": "orch-worker", "endpoint": endpoint},
    }
    cfg.write_text(tomli_w.dumps({"storage": {"url": url, "stale_after_minutes": 1.0}, "recovery": recovery}))
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    provider = build_provider(config.recovery)
    store = Store(tmp_path / "orch.db")
    remote = Remote(StorageSection(url=url, stale_after_minutes=1.0))
    return controller_module.Controller(
        config, store, remote, provider, controller_id="ctl-aws", clock=clock, keys=KEYS
    )


def _kinds(c: Any) -> list[str]:
    return [e["kind"] for e in c.store.recovery_events()]


def _launched(ec2: Any) -> list[dict[str, Any]]:
    reply = ec2.describe_instances(Filters=[{"Name": "tag:orch:jobs", "Values": [UID]}])
    return [i for r in reply["Reservations"] for i in r["Instances"]]


def test_the_controller_with_the_aws_provider_waits_for_ec2_fails_backs_off_then_launches(ec2, ec2_server, tmp_path):
    url = f"file://{tmp_path}/mirror"
    remote = Remote(StorageSection(url=url))
    clock = Clock(time.time())
    old = _running_instance(ec2)
    _put_manifest(remote, clock.t - 120, old)  # silent for 2 min, stale after 1
    c = _controller(tmp_path, url, ec2_server.endpoint, clock)

    c.pass_once()
    assert cl.read_claims(remote, UID) == [], "EC2 says the old instance runs: nothing is launched"

    ec2.terminate_instances(InstanceIds=[old])
    c.pass_once()  # gone now; but there is no launch template yet
    claims = cl.read_claims(remote, UID)
    assert [x.status for x in claims] == ["failed"]
    assert _kinds(c) == ["machine_lost", "relaunch_failed"]
    failure = c.store.recovery_events()[-1]["detail"]
    assert "launch template 'orch-worker'" in failure and "InvalidLaunchTemplate" in failure
    assert _launched(ec2) == []

    user_data = base64.b64encode(b"#!/bin/bash\necho installing orch\n").decode()
    ec2.create_launch_template(
        LaunchTemplateName="orch-worker",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge", "UserData": user_data},
    )
    c.pass_once()
    assert len(cl.read_claims(remote, UID)) == 1, "no new launch before the backoff is over"
    clock.t += 10  # the first backoff is poll_seconds
    c.pass_once()

    claims = cl.read_claims(remote, UID)
    assert [x.status for x in claims] == ["failed", "launched"]
    assert _kinds(c)[-1] == "relaunched"
    (new,) = _launched(ec2)
    assert new["InstanceLifecycle"] == "spot"
    assert new["InstanceId"] in claims[-1].launched

    # That machine is lost too: the job's second loss, so its next machine is on-demand.
    ec2.terminate_instances(InstanceIds=[new["InstanceId"]])
    _put_manifest(remote, clock.t - 120, new["InstanceId"])
    for _ in range(3):
        clock.t += 60
        c.pass_once()
    markets = {
        i["InstanceId"]: {t["Key"]: t["Value"] for t in i["Tags"]}["orch:market"]
        for i in _launched(ec2)
        if i["State"]["Name"] != "terminated"
    }
    assert list(markets.values()) == ["on-demand"], markets


def _lease(remote: Remote, heartbeat: Any, home: str, state: str = "running") -> None:
    """A daemon's lease with no instance id in it (its config lists no "aws" notice source)."""
    m = {
        "version": 1,
        "uid": UID,
        "name": "tiny",
        "state": state,
        "gpus": 1,
        "spec": {"name": "tiny", "command": ["true"]},
        "owner": {"host": "ip-10-0-0-9", "home_id": home, "pid": 1, "heartbeat": heartbeat} if home else {},
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "budget": {},
    }
    if state != "running":
        m["owner"]["released"] = True
    got = remote.get_with_etag(mf.manifest_key(UID))
    remote.cas_put(mf.manifest_key(UID), mf.dump(signed(m)), got[1] if got else None)


def test_a_machine_it_launched_that_runs_without_bucket_access_is_not_replaced_and_is_stopped_at_the_end(
    ec2, ec2_server, tmp_path
):
    from orchestrator.recovery.jobview import launch_key

    url = f"file://{tmp_path}/mirror"
    remote = Remote(StorageSection(url=url))
    clock = Clock(time.time())
    try:
        ec2.create_launch_template(
            LaunchTemplateName="orch-worker",
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"},
        )
    except Exception:  # made by the test above in this module
        pass
    _lease(remote, None, "")  # `orch launch`: no machine yet
    c = _controller(tmp_path, url, ec2_server.endpoint, clock)
    c.store.recovery_mark(launch_key(UID), clock.t)
    c.pass_once()
    (first,) = cl.read_claims(remote, UID)
    instance = first.extra["instance_id"]
    assert instance.startswith("i-") and first.launched.startswith(instance + " (")
    _lease(remote, clock.t, "home-a")  # it adopted; then it loses the bucket (no heartbeat)
    for _ in range(19):  # 3 x stale_after (60 s) and more, a poll every 10 s
        clock.t += 10
        c.pass_once()
    assert len(cl.read_claims(remote, UID)) == 1, "EC2 says the machine runs: not replaced"
    assert "machine_lost" not in _kinds(c)

    ec2.terminate_instances(InstanceIds=[instance])  # now it is gone
    clock.t += 10
    c.pass_once()
    claims = cl.read_claims(remote, UID)
    assert len(claims) == 2 and "machine_lost" in _kinds(c)
    second = claims[-1].extra["instance_id"]
    _lease(remote, clock.t, "home-b")
    clock.t += 10
    c.pass_once()
    _lease(remote, clock.t, "home-b", state="succeeded")
    for _ in range(3):
        clock.t += 10
        c.pass_once()
    state = ec2.describe_instances(InstanceIds=[second])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")
    assert {m.instance_id: m.state for m in c.ledger.machines.values()} == {instance: "stopped", second: "stopped"}
