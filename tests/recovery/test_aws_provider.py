"""The `aws` recovery provider against moto's EC2 server, a real process on loopback (never real
AWS; fake credentials): the request it sends (read back from moto's own request recorder), the
instance it makes (tags, market, user data), its errors, and whether an old machine is gone."""

from __future__ import annotations

import base64
import email
import os
import shutil
import socket
import subprocess
import threading
import urllib.parse
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from ec2_server import Ec2Server, ec2_server_running

from orchestrator.recovery.aws import AwsProvider, lease_instance_id
from orchestrator.recovery.provider import Launched, LaunchRequest, RelaunchError, launched_from_output

pytest.importorskip("boto3")

FAKE_SECRET = "fake-secret-key-never-shown"
TEMPLATE_SCRIPT = "#!/bin/bash\necho template-was-here > /tmp/template-ran\n"
URL = "s3://orch-bucket/lab"


@pytest.fixture(scope="module")
def ec2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ec2Server]:
    with ec2_server_running(tmp_path_factory.mktemp("moto"), FAKE_SECRET) as server:
        yield server


@pytest.fixture(scope="module")
def ec2(ec2_server: Ec2Server) -> Any:
    import boto3

    return boto3.client("ec2", region_name="us-east-1", endpoint_url=ec2_server.endpoint)


def _template(ec2: Any, name: str, user_data: str | None = None, **data: Any) -> None:
    if user_data is not None:
        data["UserData"] = base64.b64encode(user_data.encode()).decode()
    data.setdefault("ImageId", "ami-12c6146b")
    data.setdefault("InstanceType", "g5.xlarge")
    data.setdefault("TagSpecifications", [{"ResourceType": "instance", "Tags": [{"Key": "team", "Value": "nlp"}]}])
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=data)


def _provider(server: Ec2Server, template: str) -> AwsProvider:
    settings = SimpleNamespace(region="us-east-1", launch_template=template, endpoint=server.endpoint)
    return AwsProvider(settings)


def _instance(ec2: Any, launched: "Launched | str") -> dict[str, Any]:
    """The instance a launch returned (its text starts with its id), or the one an id names."""
    instance_id = launched if isinstance(launched, str) else launched.instance_id
    assert isinstance(launched, str) or launched.text.startswith(instance_id + " (")
    reply = ec2.describe_instances(InstanceIds=[instance_id])
    return dict(reply["Reservations"][0]["Instances"][0])


def _user_data(ec2: Any, instance_id: str) -> str:
    attr = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()


def test_spot_launch_asks_for_one_time_spot_with_tags_and_the_bootstrap_after_the_templates_script(ec2, ec2_server):
    _template(ec2, "orch-spot", TEMPLATE_SCRIPT)
    request = LaunchRequest(url=URL, job_uids=("a1b2c3", "d4e5f6"), market="spot", launch_number=2)

    description = _provider(ec2_server, "orch-spot").launch(request)

    sent = ec2_server.requests("RunInstances")[-1]
    assert sent["InstanceMarketOptions.MarketType"] == "spot"
    assert sent["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert sent["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    assert sent["LaunchTemplate.LaunchTemplateName"] == "orch-spot"
    assert sent["LaunchTemplate.Version"] == "1"  # the version whose user data was extended
    assert sent["ClientToken"]  # the same on boto3's retries of this call: one instance at most
    inst = _instance(ec2, description)
    assert inst["InstanceLifecycle"] == "spot"
    assert inst["InstanceType"] == "g5.xlarge"
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["orch:jobs"] == "a1b2c3 d4e5f6"
    assert tags["orch:launch"] == "2"
    assert tags["orch:market"] == "spot"
    assert tags["team"] == "nlp"  # the template's own tags are kept
    script = _user_data(ec2, inst["InstanceId"])
    assert script.startswith(TEMPLATE_SCRIPT)  # the template's script first, then orch's, in one script
    assert script.count("#!/bin/bash") == 1
    assert "export ORCH_RECOVERY_URL=s3://orch-bucket/lab" in script
    assert "export ORCH_RECOVERY_JOBS='a1b2c3 d4e5f6'" in script
    assert 'adopt "$ORCH_RECOVERY_URL" --job "$uid" --yes' in script
    assert script.index("daemon install") < script.index("daemon start")
    assert 'credentials = "instance"' in script and 'sources = ["aws"]' in script  # the config it writes if none


def test_on_demand_launch_sends_no_market_options(ec2, ec2_server):
    _template(ec2, "orch-od")  # no user data at all
    request = LaunchRequest(url=URL, job_uids=("a1b2c3",), market="on-demand", launch_number=3)

    description = _provider(ec2_server, "orch-od").launch(request)

    sent = ec2_server.requests("RunInstances")[-1]
    assert not [k for k in sent if k.startswith("InstanceMarketOptions")]
    inst = _instance(ec2, description)
    assert "InstanceLifecycle" not in inst
    assert {t["Key"]: t["Value"] for t in inst["Tags"]}["orch:market"] == "on-demand"
    script = _user_data(ec2, inst["InstanceId"])
    assert script.startswith("#!/bin/bash\n# --- orch recovery bootstrap: launch 3 for job(s) a1b2c3 on the on-demand")


def test_cloud_config_template_becomes_multipart_with_both_parts(ec2, ec2_server):
    _template(ec2, "orch-cc", "#cloud-config\npackages: [git]\n")
    request = LaunchRequest(url=URL, job_uids=("a1b2c3",), market="spot", launch_number=1)

    description = _provider(ec2_server, "orch-cc").launch(request)

    msg = email.message_from_string(_user_data(ec2, description.instance_id))
    parts = [(p.get_content_type(), p.get_payload(decode=True).decode()) for p in msg.walk() if not p.is_multipart()]
    assert parts[0] == ("text/cloud-config", "#cloud-config\npackages: [git]\n")
    assert parts[1][0] == "text/x-shellscript" and "orch recovery bootstrap" in parts[1][1]


def test_missing_template_is_a_relaunch_error_naming_it_then_a_later_launch_succeeds(ec2, ec2_server):
    provider = _provider(ec2_server, "orch-not-yet")
    request = LaunchRequest(url=URL, job_uids=("a1b2c3",), market="spot", launch_number=1)

    with pytest.raises(RelaunchError) as caught:
        provider.launch(request)
    text = str(caught.value)
    assert text.startswith("aws provider: reading launch template 'orch-not-yet'")
    assert "InvalidLaunchTemplate" in text and "region" in text
    assert FAKE_SECRET not in text

    _template(ec2, "orch-not-yet", TEMPLATE_SCRIPT)  # the user fixes it: the next try launches
    assert provider.launch(request).instance_id.startswith("i-")


def test_a_template_that_sets_the_market_itself_is_refused(ec2, ec2_server):
    _template(ec2, "orch-fixed-spot", TEMPLATE_SCRIPT, InstanceMarketOptions={"MarketType": "spot"})
    request = LaunchRequest(url=URL, job_uids=("a1b2c3",), market="on-demand", launch_number=4)
    before = len(ec2_server.requests("RunInstances"))

    with pytest.raises(RelaunchError, match="sets InstanceMarketOptions itself"):
        _provider(ec2_server, "orch-fixed-spot").launch(request)
    assert len(ec2_server.requests("RunInstances")) == before


def _running_instance(ec2: Any, ec2_server: Ec2Server, template: str) -> tuple[AwsProvider, str]:
    _template(ec2, template, TEMPLATE_SCRIPT)
    provider = _provider(ec2_server, template)
    described = provider.launch(LaunchRequest(url=URL, job_uids=("a1b2c3",), market="spot", launch_number=1))
    return provider, described.instance_id


@pytest.mark.parametrize(
    "then, state, gone",
    [
        (None, "running", False),
        ("stop_instances", "stopped", True),
        ("terminate_instances", "terminated", True),
    ],
)
def test_machine_gone_follows_the_state_ec2_reports(ec2, ec2_server, then, state, gone):
    provider, instance_id = _running_instance(ec2, ec2_server, f"orch-gone-{state}")
    if then:
        getattr(ec2, then)(InstanceIds=[instance_id])
    assert _instance(ec2, instance_id)["State"]["Name"] == state  # moto's own answer
    assert provider.machine_gone({"host": "ip-10-0-0-7", "home_id": "h", "instance_id": instance_id}) is gone
    # a lease that holds only EC2's resource-based host name names the same instance
    assert provider.machine_gone({"host": f"{instance_id}.ec2.internal", "home_id": "h"}) is gone


def test_an_instance_ec2_no_longer_knows_is_gone(ec2, ec2_server):
    from botocore.exceptions import ClientError

    vanished = "i-0123456789abcdef0"
    with pytest.raises(ClientError) as said:
        ec2.describe_instances(InstanceIds=[vanished])
    assert said.value.response["Error"]["Code"] == "InvalidInstanceID.NotFound"  # moto's answer, as EC2's
    assert _provider(ec2_server, "orch-unused").machine_gone({"instance_id": vanished}) is True


def test_a_lease_without_an_instance_id_cannot_tell_and_asks_nothing(ec2_server):
    before = len(ec2_server.requests("DescribeInstances"))
    assert _provider(ec2_server, "orch-unused").machine_gone({"host": "ip-10-0-0-7", "home_id": "h"}) is None
    assert len(ec2_server.requests("DescribeInstances")) == before


class Ec2Refusing:
    """A loopback endpoint answering every EC2 call with EC2's own error format: 403
    UnauthorizedOperation (an IAM policy without ec2:DescribeInstances)."""

    BODY = (
        b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>UnauthorizedOperation</Code>'
        b"<Message>You are not authorized to perform this operation.</Message></Error></Errors>"
        b"<RequestID>5ae0c1b4-0000-0000-0000-000000000000</RequestID></Response>"
    )

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.actions: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                outer.actions.append(dict(urllib.parse.parse_qsl(body)).get("Action", ""))
                self.send_response(403)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(Ec2Refusing.BODY)))
                self.end_headers()
                self.wfile.write(Ec2Refusing.BODY)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_machine_gone_cannot_tell_when_ec2_refuses_the_question(ec2_server):
    refusing = Ec2Refusing()
    try:
        settings = SimpleNamespace(region="us-east-1", launch_template="t", endpoint=refusing.endpoint)
        assert AwsProvider(settings).machine_gone({"instance_id": "i-0123456789abcdef0"}) is None
        assert refusing.actions == ["DescribeInstances"]  # it asked, EC2 said no: not a loss, not a retry
    finally:
        refusing.close()


def test_machine_gone_cannot_tell_when_ec2_is_unreachable(ec2_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    settings = SimpleNamespace(region="us-east-1", launch_template="t", endpoint=closed)
    assert AwsProvider(settings).machine_gone({"instance_id": "i-0123456789abcdef0"}) is None


def test_machine_gone_cannot_tell_without_a_region(tmp_path):
    provider = AwsProvider(SimpleNamespace(region=None, launch_template="t", endpoint=None))
    os_env = {k: os.environ.pop(k) for k in ("AWS_DEFAULT_REGION", "AWS_REGION") if k in os.environ}
    try:
        with pytest.raises(RelaunchError, match="no region"):  # why it cannot tell: nothing else
            provider._ec2()
        assert provider.machine_gone({"instance_id": "i-0123456789abcdef0"}) is None
    finally:
        os.environ.update(os_env)


@pytest.mark.parametrize(
    "code, message, says",
    [
        ("InsufficientInstanceCapacity", "We currently do not have sufficient g5.xlarge capacity", "no capacity"),
        ("SpotMaxPriceTooLow", "Your Spot request price of 0.1 is lower than the minimum", "maximum price"),
        ("RequestLimitExceeded", "Request limit exceeded.", "throttled"),
        ("VcpuLimitExceeded", "You have requested more vCPU capacity", "quota"),
        (
            "UnauthorizedOperation",
            "You are not authorized to perform this operation. Encoded authorization failure message: AbC123xyz",
            "IAM policy",
        ),
    ],
)
def test_ec2_errors_become_relaunch_errors_that_say_what_to_do(code, message, says):
    from botocore.exceptions import ClientError

    exc = ClientError({"Error": {"Code": code, "Message": message}}, "RunInstances")
    provider = AwsProvider(SimpleNamespace(region="us-east-1", launch_template="orch-worker", endpoint=None))

    err = provider._error("run-instances from launch template 'orch-worker'", exc)

    assert isinstance(err, RelaunchError)
    text = str(err)
    assert text.startswith(f"aws provider: run-instances from launch template 'orch-worker': {code}: ")
    assert says in text
    assert "AbC123xyz" not in text


@pytest.mark.parametrize(
    "owner, expected",
    [
        ({"instance_id": "i-0123456789abcdef0", "host": "x"}, "i-0123456789abcdef0"),
        ({"host": "i-0123456789abcdef0.ec2.internal"}, "i-0123456789abcdef0"),
        ({"host": "ip-172-31-0-5.ec2.internal"}, None),
        ({"instance_id": "i-$(reboot)"}, None),
        ({}, None),
    ],
)
def test_instance_of_reads_the_recorded_id_or_a_resource_named_host(owner, expected):
    assert lease_instance_id(owner) == expected


def _doc_block(first_lines: str) -> str:
    """The fenced block of docs/recovery-providers.md that starts with `first_lines`."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "recovery-providers.md").read_text()
    for block in text.split("```")[1::2]:
        body = block.split("\n", 1)[1]
        if body.startswith(first_lines):
            return body
    raise AssertionError(f"no block starting with {first_lines!r} in docs/recovery-providers.md")


@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_the_documented_aws_cli_launch_script_works_against_ec2(ec2, ec2_server, tmp_path, market):
    aws_cli = shutil.which("aws")
    if aws_cli is None:
        pytest.skip("the AWS CLI is not installed")
    _template(ec2, f"orch-cli-{market}", TEMPLATE_SCRIPT)
    script = tmp_path / "launch-aws.sh"
    script.write_text(_doc_block("#!/bin/bash\n# launch-aws.sh"))
    env = dict(
        os.environ,
        ORCH_RECOVERY_URL=URL,
        ORCH_RECOVERY_JOBS="a1b2c3 d4e5f6",
        ORCH_RECOVERY_MARKET=market,
        ORCH_RECOVERY_LAUNCH="2",
        LAUNCH_TEMPLATE=f"orch-cli-{market}",
        AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL=ec2_server.endpoint,
    )

    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    instance_id = launched_from_output(done.stdout).instance_id  # what `orch watch` records: its instance= line
    assert done.stdout.strip().splitlines()[-1] == f"instance={instance_id}"
    inst = _instance(ec2, instance_id)
    assert inst.get("InstanceLifecycle") == ("spot" if market == "spot" else None)
    sent = ec2_server.requests("RunInstances")[-1]
    if market == "spot":
        assert sent["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
        assert sent["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    else:
        assert not [k for k in sent if k.startswith("InstanceMarketOptions")]
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert (tags["orch:jobs"], tags["orch:launch"], tags["orch:market"]) == ("a1b2c3 d4e5f6", "2", market)

    # The user data it sent, run by bash on "the new machine" with orch installed: adopt each job, start.
    user_data = _user_data(ec2, instance_id).replace("/var/log/orch-recovery.log", str(tmp_path / "boot.log"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "orch").write_text('#!/bin/sh\necho "$*" >> "$CALLS"\n')
    (bin_dir / "orch").chmod(0o755)
    calls = tmp_path / "calls"
    boot_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "root"), "CALLS": str(calls)}
    assert subprocess.run(["bash", "-c", user_data], env=boot_env, timeout=30).returncode == 0
    assert calls.read_text().splitlines() == [
        f"adopt {URL} --job a1b2c3 --yes",
        f"adopt {URL} --job d4e5f6 --yes",
        "daemon install",
        "daemon start",
    ]
    config = (tmp_path / "root" / ".orch" / "config.toml").read_text()
    assert f'url = "{URL}"' in config and 'credentials = "instance"' in config
