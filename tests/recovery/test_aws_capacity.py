"""The `aws` provider's market signals against moto's EC2 server on loopback: EC2's capacity codes
become NoCapacity (the controller's free wait), quotas stay real failures, and `stop` terminates
the instance. moto never runs out of capacity, so a small loopback proxy in front of it answers
spot RunInstances with EC2's own error document while the test says the zone has none."""

from __future__ import annotations

import base64
import http.server
import threading
import urllib.parse
import urllib.request
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
from ec2_server import Ec2Server, ec2_server_running

from orchestrator.recovery.aws import AwsProvider
from orchestrator.recovery.provider import LaunchRequest, NoCapacity, RelaunchError, StopError

pytest.importorskip("boto3")

URL = "s3://orch-bucket/lab"
ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error></Errors><RequestID>req-1</RequestID></Response>"
)


class RefusingProxy:
    """Forwards every request to moto, except spot RunInstances while `refuse` names a code."""

    def __init__(self, upstream: str):
        self.refuse: str | None = None
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                form = dict(urllib.parse.parse_qsl(body.decode()))
                if proxy.refuse and form.get("Action") == "RunInstances":
                    if form.get("InstanceMarketOptions.MarketType") == "spot":
                        out = ERROR_XML.format(
                            code=proxy.refuse, message="We currently do not have sufficient capacity"
                        )
                        return self._answer(400, out.encode(), "text/xml")
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


@pytest.fixture(scope="module")
def ec2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ec2Server]:
    with ec2_server_running(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(ec2_server: Ec2Server) -> Iterator[RefusingProxy]:
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=ec2_server.endpoint)
    data = {
        "ImageId": "ami-12c6146b",
        "InstanceType": "g5.xlarge",
        "UserData": base64.b64encode(b"#!/bin/bash\n").decode(),
    }
    ec2.create_launch_template(LaunchTemplateName="orch-cap", LaunchTemplateData=data)
    p = RefusingProxy(ec2_server.endpoint)
    yield p
    p.server.shutdown()


def provider(endpoint: str) -> AwsProvider:
    return AwsProvider(SimpleNamespace(region="us-east-1", launch_template="orch-cap", endpoint=endpoint))


@pytest.mark.parametrize(
    "code",
    ["InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity", "UnfulfillableCapacity"],
)
def test_ec2_capacity_codes_are_no_capacity_and_on_demand_still_launches(proxy, code):
    proxy.refuse = code
    try:
        with pytest.raises(NoCapacity) as caught:
            provider(proxy.endpoint).launch(LaunchRequest(URL, ("a1b2",), "spot", 1))
        assert code in str(caught.value)
        assert (
            provider(proxy.endpoint).launch(LaunchRequest(URL, ("a1b2",), "on-demand", 2)).instance_id.startswith("i-")
        )
    finally:
        proxy.refuse = None


@pytest.mark.parametrize("code", ["MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "SpotMaxPriceTooLow", "Bogus"])
def test_quotas_prices_and_unknown_codes_are_real_failures(proxy, code):
    proxy.refuse = code
    try:
        with pytest.raises(RelaunchError) as caught:
            provider(proxy.endpoint).launch(LaunchRequest(URL, ("a1b2",), "spot", 1))
        assert not isinstance(caught.value, NoCapacity) and code in str(caught.value)
    finally:
        proxy.refuse = None


def test_stop_terminates_the_instance_and_a_gone_one_is_fine(ec2_server):
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=ec2_server.endpoint)
    p = provider(ec2_server.endpoint)
    described = p.launch(LaunchRequest(URL, ("a1b2",), "on-demand", 1))
    instance_id = described.instance_id
    assert "shutting-down" in p.stop(instance_id) or "terminated" in p.stop(instance_id)
    state = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")
    assert p.machine_gone({"instance_id": instance_id}) is True
    with pytest.raises(StopError, match="not an EC2 instance id"):
        p.stop("machine-$(reboot)")
