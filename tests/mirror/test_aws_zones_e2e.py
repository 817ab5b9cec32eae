"""Zones end to end with the `aws` provider, every part real but the cloud's machines: moto's EC2
on loopback with two subnets in two availability zones, behind a proxy that refuses spot
RunInstances (InsufficientInstanceCapacity) in the subnets it is told to, and that brings up a
"machine" for every instance EC2 did launch (a fresh ORCH_HOME that adopts the jobs of the
instance's orch:jobs tag and starts a daemon, as the bootstrap in its user data would);
`orch watch` as a subprocess; a tiny-BERT job from `orch launch` in a file:// bucket.

Zone a refuses spot: the job launches in zone b at once. That machine is lost mid-run (its
processes SIGKILLed, its folder deleted, its instance terminated) while both zones refuse spot:
the job waits, free; when zone a's capacity returns the job comes back in zone a and ends with
weights torch.equal to an uninterrupted run's."""

from __future__ import annotations

import base64
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
import tomli_w
from daemon_harness import wait_for
from mirror_harness import storage_home
from recovery_harness import BOOTSTRAP_SH, Watch, claims, controller_home, env, lose_machine, stop_machine
from tiny_bert import assert_same, job_spec, weights

from orchestrator.home.paths import Home
from orchestrator.model.states import JobState
from orchestrator.objectstore import claims as cl
from orchestrator.objectstore.remote import Remote
from orchestrator.spec.config import load_config
from orchestrator.store import Store
from tests.recovery.ec2_server import ec2_server_running

pytest.importorskip("boto3")
pytestmark = pytest.mark.slow

STALE_MIN = 0.3  # 18 s without a heartbeat (one a second): the machine is lost
REFUSAL = (
    '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InsufficientInstanceCapacity</Code>'
    "<Message>We currently do not have sufficient capacity in the Availability Zone you requested</Message>"
    "</Error></Errors><RequestID>req-1</RequestID></Response>"
)


class Cloud:
    """In front of moto: spot refused in the subnets of `refused`; every instance launched becomes
    a machine (`on_launch(instance id, subnet, job uids)`)."""

    def __init__(self, upstream: str, on_launch: Callable[[str, str, str], None]):
        self.refused: set[str] = set()
        self.spot_runs: list[tuple[str, bool]] = []  # (subnet, refused) of every spot RunInstances
        cloud = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                form = dict(urllib.parse.parse_qsl(body.decode()))
                run = form.get("Action") == "RunInstances"
                if run and form.get("InstanceMarketOptions.MarketType") == "spot":
                    refused = form.get("SubnetId", "") in cloud.refused
                    cloud.spot_runs.append((form.get("SubnetId", ""), refused))
                    if refused:
                        return self._answer(400, REFUSAL.encode(), "text/xml")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                req = urllib.request.Request(upstream + self.path, data=body, headers=headers, method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        data = resp.read()
                        self._answer(resp.status, data, resp.headers.get("Content-Type", "text/xml"))
                except urllib.error.HTTPError as exc:
                    return self._answer(exc.code, exc.read(), exc.headers.get("Content-Type", "text/xml"))
                if run:
                    instance = re.search(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", data)
                    tags = {
                        form[k]: form[k[: -len("Key")] + "Value"]
                        for k in form
                        if re.match(r"TagSpecification\.1\.Tag\.\d+\.Key$", k)
                    }
                    if instance:
                        on_launch(instance.group(1).decode(), form.get("SubnetId", ""), tags.get("orch:jobs", ""))

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


def job_on(root: Path, uid: str) -> Any:
    db = Home(root / "home").db
    if not db.exists():
        return None
    store = Store(db)
    try:
        return store.by_uid(uid)
    finally:
        store.close()


def step_on(root: Path, uid: str) -> int:
    from orchestrator.contract import read_json

    job = job_on(root, uid)
    if job is None:
        return -1
    return int((read_json(Home(root / "home").run_dir(job.id) / "progress.json") or {}).get("step") or 0)


def test_refused_in_one_zone_runs_in_the_other_lost_there_comes_back_in_the_first_and_ends_identical(
    workload, uninterrupted, homes, tmp_path
):
    import boto3

    url = f"file://{tmp_path}/store"
    template = storage_home(tmp_path / "template", url, stale_after_minutes=STALE_MIN)  # the machines' config
    homes.append(template)
    machines = tmp_path / "machines"
    machines.mkdir()
    (machines / "bootstrap.sh").write_text(BOOTSTRAP_SH)
    booted: dict[str, tuple[Path, str]] = {}  # instance id -> (machine folder, subnet)

    def boot(instance: str, subnet: str, uids: str) -> None:
        root = machines / instance
        (root / "home").mkdir(parents=True)
        shutil.copy(template.root / "config.toml", root / "home" / "config.toml")
        booted[instance] = (root, subnet)
        with open(root / "bootstrap.log", "wb") as log:
            subprocess.Popen(
                ["bash", str(machines / "bootstrap.sh"), str(root)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env(ORCH_RECOVERY_JOBS=uids, ORCH_RECOVERY_URL=url),
            )

    (tmp_path / "moto").mkdir()
    with ec2_server_running(tmp_path / "moto") as ec2_server:
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=ec2_server.endpoint)
        vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
        subnet_a, subnet_b = (
            ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=az)["Subnet"]["SubnetId"]
            for az, cidr in (("us-east-1a", "10.7.1.0/24"), ("us-east-1b", "10.7.2.0/24"))
        )
        ec2.create_launch_template(
            LaunchTemplateName="orch-e2e",
            LaunchTemplateData={
                "ImageId": "ami-12c6146b",
                "InstanceType": "g5.xlarge",
                "UserData": base64.b64encode(b"#!/bin/bash\n").decode(),
            },
        )
        cloud = Cloud(ec2_server.endpoint, boot)
        cloud.refused = {subnet_a}
        croot = controller_home(
            tmp_path,
            url,
            {
                "provider": "aws",
                "aws": {"region": "us-east-1", "launch_template": "orch-e2e", "endpoint": cloud.endpoint},
                "zones": [
                    {"name": "a", "subnet": subnet_a, "spot_price": 1.0, "on_demand_price": 3.0},
                    {"name": "b", "subnet": subnet_b, "spot_price": 1.0, "on_demand_price": 3.0},
                ],
                "poll_seconds": 0.3,
                "max_spot_wait_minutes": 30,  # no deadline: it waits for spot, never on-demand here
                "launch_timeout_minutes": 2,
                "changeover_minutes": 0.05,
            },
            stale_after_minutes=STALE_MIN,
        )
        job_toml = tmp_path / "tiny.toml"
        job_toml.write_text(tomli_w.dumps(job_spec(workload, "zones", slow_step_s=0.3)))
        watch = Watch(croot)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "--home", str(croot), "launch", str(job_toml), "--json"],
                capture_output=True,
                text=True,
                env=env(),
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            uid = json.loads(done.stdout)["uid"]
            remote = Remote(load_config(croot / "config.toml", required=True).storage)
            watch.start()

            # Zone a refuses spot: the same claim launches in zone b at once.
            wait_for(
                lambda: len(booted) == 1 and claims(remote, uid)[0].status == cl.LAUNCHED,
                60,
                interval=0.1,
                what=lambda: f"a first machine\n{watch.output()}",
            )
            (first,) = claims(remote, uid)
            assert (first.status, first.market, first.extra.get("zone")) == (cl.LAUNCHED, "spot", "b")
            assert cloud.spot_runs == [(subnet_a, True), (subnet_b, False)]
            (instance_b, (machine_b, subnet)) = next(iter(booted.items()))
            assert subnet == subnet_b

            # Lost mid-run, after a checkpoint (every 10 steps) is mirrored, while no zone has spot.
            wait_for(
                lambda: step_on(machine_b, uid) >= 14,
                180,
                interval=0.2,
                what=lambda: f"training in b\n{watch.output()}",
            )
            cloud.refused = {subnet_a, subnet_b}
            lose_machine(machine_b)
            ec2.terminate_instances(InstanceIds=[instance_b])
            wait_for(
                lambda: any(c.n == 2 and c.status == cl.NO_CAPACITY for c in claims(remote, uid)),
                120,
                interval=0.2,
                what=lambda: f"the job waiting for spot after the loss\n{watch.output()}",
            )
            assert len(booted) == 1  # it waits, free

            # Zone a's capacity returns: the job comes back there and finishes.
            cloud.refused = {subnet_b}
            wait_for(lambda: len(booted) == 2, 60, interval=0.1, what=lambda: f"a second machine\n{watch.output()}")
            machine_a, subnet = [v for k, v in booted.items() if k != instance_b][0]
            assert subnet == subnet_a
            wait_for(
                lambda: job_on(machine_a, uid) is not None and job_on(machine_a, uid).state is JobState.SUCCEEDED,
                240,
                interval=0.3,
                what=lambda: f"the job finishing in zone a\n{watch.output()}",
            )
            found = claims(remote, uid)
            assert [(c.n, c.status, c.extra.get("zone")) for c in found] == [
                (1, cl.LAUNCHED, "b"),
                (2, cl.LAUNCHED, "a"),
            ]
            assert_same(uninterrupted["weights"], weights(Home(machine_a / "home").run_dir(job_on(machine_a, uid).id)))
            shown = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "orchestrator.cli",
                    "--home",
                    str(machine_a / "home"),
                    "show",
                    str(job_on(machine_a, uid).id),
                    "--json",
                ],
                capture_output=True,
                text=True,
                env=env(),
                timeout=120,
            )
            data = json.loads(shown.stdout)
            assert [(mc["market"], mc.get("zone")) for mc in data["machines"]][-1] == ("spot", "a"), data["machines"]
        finally:
            watch.stop()
            cloud.server.shutdown()
            for root, _ in booted.values():
                stop_machine(root)
