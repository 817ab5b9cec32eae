"""[[recovery.zones]] with the `aws` provider against moto's EC2 on loopback: two subnets in two
availability zones; EC2 refuses spot in the first (InsufficientInstanceCapacity, answered by a
loopback proxy in front of moto, which never runs out); the job's next launch goes to the second
zone at once -- at the same moment, not after a retry -- in that zone's subnet, and its claim
names the zone. Real controller, real file:// mirror, real EC2 API server."""

from __future__ import annotations

import base64
import http.server
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
from bucket_key import KEYS, signed
from ec2_server import Ec2Server, ec2_server_running

pytest.importorskip("boto3")

from orchestrator.objectstore import claims as cl  # noqa: E402
from orchestrator.objectstore import manifest as mf  # noqa: E402
from orchestrator.objectstore.remote import Remote  # noqa: E402
from orchestrator.recovery import controller as controller_module  # noqa: E402
from orchestrator.recovery.build import build_provider  # noqa: E402
from orchestrator.spec.config import StorageSection, load_config  # noqa: E402
from orchestrator.store import Store  # noqa: E402

UID = "b1b2c3d4e5f60718293a4b5c6d7e8f90"
REFUSAL = (
    '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InsufficientInstanceCapacity</Code>'
    "<Message>We currently do not have sufficient capacity in the Availability Zone you requested</Message>"
    "</Error></Errors><RequestID>req-1</RequestID></Response>"
)


class ZoneRefusingProxy:
    """Forwards to moto, except spot RunInstances into the subnet `refused` names."""

    def __init__(self, upstream: str):
        self.refused: str | None = None
        self.spot_runs: list[str] = []  # the subnet of every spot RunInstances, in order
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                form = dict(urllib.parse.parse_qsl(body.decode()))
                if form.get("Action") == "RunInstances" and form.get("InstanceMarketOptions.MarketType") == "spot":
                    proxy.spot_runs.append(form.get("SubnetId", ""))
                    if form.get("SubnetId") == proxy.refused:
                        return self._answer(400, REFUSAL.encode(), "text/xml")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                req = urllib.request.Request(upstream + self.path, data=body, headers=headers, method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        self._answer(resp.status, resp.read(), resp.headers.get("Content-Type", "text/xml"))
                except urllib.error.HTTPError as exc:
                    self._answer(exc.code, exc.read(), exc.headers.get("Content-Type", "text/xml"))

            def _answer(self, status: int, data: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def ec2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ec2Server]:
    with ec2_server_running(tmp_path_factory.mktemp("moto")) as server:
        yield server


def test_a_zone_refusing_spot_sends_the_launch_to_the_other_zone_at_once(ec2_server, tmp_path):
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=ec2_server.endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnets = {
        az: ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=az)["Subnet"]["SubnetId"]
        for az, cidr in (("us-east-1a", "10.9.1.0/24"), ("us-east-1b", "10.9.2.0/24"))
    }
    ec2.create_launch_template(
        LaunchTemplateName="orch-zones",
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "InstanceType": "g5.xlarge",
            "UserData": base64.b64encode(b"#!/bin/bash\n").decode(),
        },
    )
    proxy = ZoneRefusingProxy(ec2_server.endpoint)
    proxy.refused = subnets["us-east-1a"]
    try:
        old = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        ec2.terminate_instances(InstanceIds=[old])
        url = f"file://{tmp_path}/mirror"
        remote = Remote(StorageSection(url=url))
        clock = Clock(time.time())
        _put_manifest(remote, clock.t - 120, old)
        c = _controller(tmp_path, url, proxy.endpoint, subnets, clock)

        c.pass_once()  # both zones untried: the first in the config, which refuses
        (claim,) = cl.read_claims(remote, UID)
        assert (claim.status, claim.market, claim.extra.get("zone")) == (cl.NO_CAPACITY, "spot", "a")
        c.pass_once()  # the same moment: the other zone, not a wait for the retry
        (claim,) = cl.read_claims(remote, UID)  # the capacity wait's claim, reused: not a new launch
        assert (claim.status, claim.market, claim.extra.get("zone")) == (cl.LAUNCHED, "spot", "b"), claim
        assert proxy.spot_runs == [subnets["us-east-1a"], subnets["us-east-1b"]]
        instance_id = claim.launched.split()[0]
        got = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        assert got["SubnetId"] == subnets["us-east-1b"]
        assert got["Placement"]["AvailabilityZone"] == "us-east-1b"
        assert ", b)" in claim.launched  # the launch names its zone
        machine = c.ledger.get(instance_id)  # the machine ledger records the zone and prices it there
        assert machine is not None and (machine.zone, machine.price_hour) == ("b", 1.0)
    finally:
        proxy.server.shutdown()


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
    remote.put_bytes(mf.manifest_key(UID), mf.dump(signed(m)))


def _controller(tmp_path: Path, url: str, endpoint: str, subnets: dict[str, str], clock: Clock) -> Any:
    cfg = tmp_path / "config.toml"
    recovery = {
        "provider": "aws",
        "poll_seconds": 10.0,
        "aws": {"region": "us-east-1", "launch_template": "orch-zones", "endpoint": endpoint},
        "zones": [
            {"name": "a", "subnet": subnets["us-east-1a"], "spot_price": 1.0, "on_demand_price": 3.0},
            {"name": "b", "subnet": subnets["us-east-1b"], "spot_price": 1.0, "on_demand_price": 3.0},
        ],
    }
    cfg.write_text(tomli_w.dumps({"storage": {"url": url, "stale_after_minutes": 1.0}, "recovery": recovery}))
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    store = Store(tmp_path / "orch.db")
    remote = Remote(StorageSection(url=url, stale_after_minutes=1.0))
    return controller_module.Controller(
        config, store, remote, build_provider(config.recovery), controller_id="ctl-zones", clock=clock, keys=KEYS
    )


def test_a_machine_in_another_zones_region_is_asked_about_and_stopped_there(ec2_server, tmp_path):
    """A zone in another region than [recovery.aws]'s: a provider that did not launch the machine
    (a restarted controller, which has only the ledger's id) finds it there, not 'already gone'."""
    import boto3

    west = boto3.client("ec2", region_name="us-west-2", endpoint_url=ec2_server.endpoint)
    instance = west.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    cfg = tmp_path / "config.toml"
    recovery = {
        "provider": "aws",
        "aws": {"region": "us-east-1", "launch_template": "orch-zones", "endpoint": ec2_server.endpoint},
        "zones": [{"name": "east", "spot_price": 1.0}, {"name": "west", "region": "us-west-2", "spot_price": 1.0}],
    }
    cfg.write_text(tomli_w.dumps({"storage": {"url": f"file://{tmp_path}/mirror"}, "recovery": recovery}))
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    provider = build_provider(config.recovery)

    assert provider.machine_gone({"instance_id": instance}) is False
    said = provider.stop(instance)
    assert said.startswith(instance) and "already gone" not in said, said
    (state,) = [
        i["State"]["Name"]
        for r in west.describe_instances(InstanceIds=[instance])["Reservations"]
        for i in r["Instances"]
    ]
    assert state in ("shutting-down", "terminated")
    assert provider.machine_gone({"instance_id": instance}) is True


def test_a_zone_without_a_spot_price_reads_ec2s_spot_price_history(ec2_server, tmp_path):
    """No spot_price for the zone: the aws provider asks describe_spot_price_history for the launch
    template's instance type in the subnet's availability zone, keeps the answer a few minutes, and
    the controller's zones price the zone by it (on-demand from [pricing])."""
    import boto3

    from orchestrator.recovery import aws_prices
    from orchestrator.recovery.zones import ZoneMarkets

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=ec2_server.endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.8.1.0/24", AvailabilityZone="us-east-1c")["Subnet"]["SubnetId"]
    ec2.create_launch_template(
        LaunchTemplateName="orch-priced", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "m5.large"}
    )
    cfg = tmp_path / "config.toml"
    recovery = {
        "provider": "aws",
        "aws": {"region": "us-east-1", "launch_template": "orch-priced", "endpoint": ec2_server.endpoint},
        "zones": [{"name": "c", "subnet": subnet}, {"name": "d", "spot_price": 0.5}],
    }
    pricing = {"gpu_hour": 1.0, "on_demand_gpu_hour": 3.0}
    cfg.write_text(
        tomli_w.dumps({"storage": {"url": f"file://{tmp_path}/mirror"}, "recovery": recovery, "pricing": pricing})
    )
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    provider = build_provider(config.recovery)
    clock = Clock(1000.0)
    provider._prices = aws_prices.SpotPriceHistory(provider, clock)  # the same reader, on a test clock
    asked = len(ec2_server.requests("DescribeSpotPriceHistory"))

    price = provider.spot_price("c")
    assert price is not None and price > 0  # moto's history: one price per offered type and zone
    (request,) = ec2_server.requests("DescribeSpotPriceHistory")[asked:]
    assert request["InstanceType.1"] == "m5.large"
    assert (request["Filter.1.Name"], request["Filter.1.Value.1"]) == ("availability-zone", "us-east-1c")
    assert provider.spot_price("c") == price  # kept: no second request within the TTL
    assert len(ec2_server.requests("DescribeSpotPriceHistory")) == asked + 1
    clock.t += aws_prices.TTL_S
    assert provider.spot_price("c") == price
    assert len(ec2_server.requests("DescribeSpotPriceHistory")) == asked + 2  # read again once stale
    assert provider.spot_price("nowhere") is None

    zones = ZoneMarkets.of(config, provider)
    c = zones.priced(zones.zones[0], 1)
    assert (c.spot_price, c.on_demand_price) == (price, 3.0)  # on-demand: [pricing] for one GPU
    assert zones.priced(zones.zones[1], 1).spot_price == 0.5  # a configured price is not asked for
