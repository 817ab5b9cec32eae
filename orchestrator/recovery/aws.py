"""The `aws` recovery provider: a replacement machine on EC2 from a launch template, with orch's
bootstrap added to the template's user data, the job uids in its tags, and the market chosen per
launch (spot: one-time, terminated on interruption; on-demand: no market options). It also asks
EC2 whether a silent lease's instance is really gone. boto3 is an optional extra (`orch-gpu[aws]`),
imported here only, when the provider first talks to EC2."""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Optional, Sequence

from ..model.markets import SPOT
from .bootstrap import bootstrap_script, check_request, decode_user_data, with_bootstrap
from .provider import Launched, LaunchRequest, NoCapacity, RelaunchError, StopError

GONE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
ALIVE_STATES = frozenset({"pending", "running"})
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
TAG_PREFIX = "orch:"
TAG_VALUE_MAX = 256  # EC2's limit on a tag's value
log = logging.getLogger("orch.watch")

# EC2's answers that mean "no machine of this kind on this market now" (its API reference, "Error
# codes"): a market signal, so the job waits and the try does not count toward max_launches.
# Quotas (MaxSpotInstanceCountExceeded, InstanceLimitExceeded, VcpuLimitExceeded), a maximum price
# below the spot price (SpotMaxPriceTooLow), credentials and a bad template are the user's to fix:
# real failures, which back off and count.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "UnfulfillableCapacity",
    }
)

# What a tired researcher should do about each EC2 error code a launch meets most.
_HINTS = {
    "InsufficientInstanceCapacity": "EC2 has no capacity for this instance type in this zone now; orch tries again "
    "later (a template whose subnet or type has more capacity helps)",
    "SpotMaxPriceTooLow": "the spot price is above the template's maximum price; raise it or remove it from the "
    "template (the default maximum is the on-demand price)",
    "MaxSpotInstanceCountExceeded": "the account's spot instance limit is reached; ask AWS for a higher quota",
    "InstanceLimitExceeded": "the account's instance limit is reached; ask AWS for a higher quota",
    "VcpuLimitExceeded": "the account's vCPU quota for this instance family is reached; ask AWS for a higher quota",
    "RequestLimitExceeded": "EC2 throttled the requests; orch tries again later",
    "Throttling": "EC2 throttled the requests; orch tries again later",
    "UnauthorizedOperation": "the credentials may not do this; see the IAM policy in docs/recovery-providers.md",
    "AuthFailure": "AWS refused the credentials; check the controller's AWS profile or role",
    "InvalidParameterValue": "the launch template or the request is wrong for EC2",
}


class AwsProvider:
    name = "aws"
    can_stop = True

    def __init__(self, settings: Any, zones: Sequence[Any] = ()):
        self.region: Optional[str] = getattr(settings, "region", None)
        self.template: str = str(getattr(settings, "launch_template", None) or "")
        self.endpoint: Optional[str] = getattr(settings, "endpoint", None)
        # [[recovery.zones]]: name -> (region, subnet, launch template), each falling back on [recovery.aws]
        self.zones: dict[str, tuple[Optional[str], Optional[str], str]] = {
            z.name: (z.region or self.region, z.subnet, str(z.launch_template or self.template)) for z in zones
        }
        if not self.template and (not self.zones or not all(t for _, _, t in self.zones.values())):
            raise RelaunchError("aws provider: [recovery.aws] launch_template is not set")
        self._client: Any = None
        self._clients: dict[Optional[str], Any] = {}
        self._launched_in: dict[str, Optional[str]] = {}  # instance id -> its region, where not [recovery.aws]'s
        self._prices: Any = None  # aws_prices.SpotPriceHistory, made at the first question

    def spot_price(self, zone: str) -> Optional[float]:
        """A zone's spot price per hour from EC2's spot price history (aws_prices.py; cached a few
        minutes); None when EC2 does not say, or for a zone not configured."""
        if zone not in self.zones:
            return None
        if self._prices is None:
            from .aws_prices import SpotPriceHistory

            self._prices = SpotPriceHistory(self)
        return self._prices.price(zone)

    # -- launch -----------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Launched:
        check_request(request, self.name)
        region, subnet, template = self.zones.get(request.zone, (self.region, None, self.template))
        ec2 = self._client_of(region)
        version, data = self._template_version(ec2, template)
        if data.get("InstanceMarketOptions"):
            raise RelaunchError(
                f"aws provider: launch template {template!r} sets InstanceMarketOptions itself; remove them "
                "from the template: orch chooses spot or on-demand for each launch"
            )
        script = bootstrap_script(
            request, preemption_source="aws", instance_credentials=request.url.startswith("s3://")
        )
        user_data = with_bootstrap(decode_user_data(data.get("UserData")), script)
        params: dict[str, Any] = {
            "LaunchTemplate": {**self._template_ref(template), "Version": str(version)},
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": user_data,  # raw: boto3 base64-encodes RunInstances' UserData itself
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _template_tags(data, "instance") + launch_tags(request)}
            ],
        }
        if subnet:  # the zone's subnet: where EC2 places the machine
            params["SubnetId"] = subnet
        if request.market == SPOT:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        try:  # boto3 fills in a ClientToken and keeps it across its retries: a retry never launches twice
            reply = ec2.run_instances(**params)
        except Exception as exc:
            where = f" in zone {request.zone}" if request.zone else ""
            error = self._error(f"run-instances from launch template {template!r}{where}", exc)
            if _code(exc) in CAPACITY_CODES:
                raise NoCapacity(str(error)) from None
            raise error from None
        try:
            instance = reply["Instances"][0]
            instance_id = str(instance["InstanceId"])
            if region != self.region:
                self._launched_in[instance_id] = region
            where = f", {request.zone}" if request.zone else ""
            return Launched(
                instance_id, f"{instance_id} ({instance.get('InstanceType') or '?'}, {request.market}{where})"
            )
        except (KeyError, IndexError, TypeError):
            raise RelaunchError("aws provider: EC2 answered run-instances without an instance") from None

    def _template_ref(self, template: str) -> dict[str, str]:
        if re.match(r"^lt-[0-9a-f]+$", template):
            return {"LaunchTemplateId": template}
        return {"LaunchTemplateName": template}

    def _template_version(self, ec2: Any, template: str) -> tuple[int, dict[str, Any]]:
        """The template's default version, read once per launch: its number is launched, so the
        user data orch extends is the one that runs even if a new default appears meanwhile."""
        try:
            reply = ec2.describe_launch_template_versions(**self._template_ref(template), Versions=["$Default"])
            version = reply["LaunchTemplateVersions"][0]
        except Exception as exc:
            raise self._error(f"reading launch template {template!r}", exc) from None
        return int(version["VersionNumber"]), dict(version.get("LaunchTemplateData") or {})

    # -- stop -------------------------------------------------------------------------------------

    def stop(self, instance_id: str) -> str:
        """Terminate the instance (a machine orch launched is one-time: nothing to keep). An
        instance EC2 no longer knows is already gone: that is a success."""
        if not INSTANCE_ID.match(instance_id):
            raise StopError(f"aws provider: {instance_id[:80]!r} is not an EC2 instance id (i-...)")
        for region in self._regions_of(instance_id):
            try:
                reply = self._client_of(region).terminate_instances(InstanceIds=[instance_id])
                break
            except RelaunchError as exc:
                raise StopError(str(exc)) from None
            except Exception as exc:
                if not _code(exc).startswith("InvalidInstanceID.NotFound"):
                    raise StopError(str(self._error(f"terminate-instances {instance_id}", exc))) from None
        else:  # no region where it could be knows it
            return f"{instance_id} already gone"
        states = [
            str((i.get("CurrentState") or {}).get("Name") or "?") for i in reply.get("TerminatingInstances") or []
        ]
        return f"{instance_id} {states[0] if states else 'terminating'}"

    # -- is the old machine gone? -----------------------------------------------------------------

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        """True when EC2 says the lease holder's instance is shutting down, stopped or terminated
        (or no longer exists), False while it is pending or running, None when orch cannot tell:
        no instance id in the lease (a machine whose config has no `[preemption] sources = ["aws"]`,
        or not on EC2), or EC2 did not answer."""
        instance_id = lease_instance_id(owner)
        if instance_id is None:
            return None
        for region in self._regions_of(instance_id):
            try:
                reply = self._client_of(region).describe_instances(InstanceIds=[instance_id])
                break
            except RelaunchError as exc:
                log.warning("aws provider cannot tell whether %s runs: %s", instance_id, exc)
                return None
            except Exception as exc:
                if _code(exc).startswith("InvalidInstanceID.NotFound"):
                    continue  # not in this region (terminated instances stay listed about an hour, then vanish)
                # Throttling, credentials, a network error: said with EC2's own code, then "cannot tell".
                log.warning(
                    "aws provider cannot tell whether %s runs: %s", instance_id, self._error("describe-instances", exc)
                )
                return None
        else:
            return True
        states = [
            str((inst.get("State") or {}).get("Name") or "")
            for res in reply.get("Reservations") or []
            for inst in res.get("Instances") or []
        ]
        if not states:
            return True
        if all(s in GONE_STATES for s in states):
            return True
        if any(s in ALIVE_STATES for s in states):
            return False
        return None

    # -- EC2 --------------------------------------------------------------------------------------

    def _regions_of(self, instance_id: str) -> list[Optional[str]]:
        """Where an instance may be: the region this provider launched it in, [recovery.aws]'s, then
        the other zones' regions (a machine a controller launched before it restarted)."""
        regions = [self._launched_in.get(instance_id, self.region), self.region]
        return list(dict.fromkeys(regions + [r for r, _, _ in self.zones.values()]))

    def _client_of(self, region: Optional[str]) -> Any:
        return self._ec2() if region == self.region else self._regional(region)

    def _regional(self, region: Optional[str]) -> Any:
        """A zone's region's EC2 client (one per region, made at its first use)."""
        if region not in self._clients:
            self._clients[region] = self._connect(region)
        return self._clients[region]

    def _ec2(self) -> Any:
        if self._client is None:
            self._client = self._connect(self.region)
        return self._client

    def _connect(self, region: Optional[str]) -> Any:
        try:
            import boto3
            from botocore.config import Config as BotoConfig
        except ImportError:
            raise RelaunchError(
                "aws provider: boto3 is not installed where `orch watch` runs: pip install 'orch-gpu[aws]'"
            ) from None
        config = BotoConfig(connect_timeout=10, read_timeout=30, retries={"mode": "standard", "max_attempts": 4})
        try:
            return boto3.client("ec2", region_name=region, endpoint_url=self.endpoint, config=config)
        except Exception as exc:
            raise self._error("connecting to EC2", exc) from None

    def _error(self, doing: str, exc: BaseException) -> RelaunchError:
        """A RelaunchError naming the provider, what it was doing and EC2's own code and message
        (AWS messages carry no secrets; the encoded authorization details are cut off)."""
        code = _code(exc)
        if code:
            message = str(((getattr(exc, "response", None) or {}).get("Error") or {}).get("Message") or "")
            message = message.split(" Encoded authorization failure message:")[0][:300]
            hint = _HINTS.get(code) or (
                "no such launch template in this region; check [recovery.aws] launch_template and region"
                if code.startswith("InvalidLaunchTemplate")
                else ""
            )
            text = f"aws provider: {doing}: {code}: {message}" + (f" ({hint})" if hint else "")
            return RelaunchError(text)
        kind = type(exc).__name__
        if kind == "NoRegionError":
            return RelaunchError(f"aws provider: {doing}: no region; set [recovery.aws] region or AWS_REGION")
        if kind in ("NoCredentialsError", "PartialCredentialsError"):
            return RelaunchError(
                f"aws provider: {doing}: no AWS credentials where `orch watch` runs "
                "(an instance role, AWS_PROFILE or ~/.aws/credentials)"
            )
        return RelaunchError(f"aws provider: {doing}: {kind}: {str(exc)[:300]}")


def launch_tags(request: LaunchRequest) -> list[dict[str, str]]:
    """The job uids (several tags when they pass EC2's 256-character value limit), the launch
    number, the market, and a Name for the console."""
    tags, chunk, n = [], "", 1
    for uid in request.job_uids:
        if chunk and len(chunk) + 1 + len(uid) > TAG_VALUE_MAX:
            tags.append({"Key": TAG_PREFIX + ("jobs" if n == 1 else f"jobs-{n}"), "Value": chunk})
            chunk, n = "", n + 1
        chunk = f"{chunk} {uid}" if chunk else uid
    tags.append({"Key": TAG_PREFIX + ("jobs" if n == 1 else f"jobs-{n}"), "Value": chunk})
    more = f" +{len(request.job_uids) - 1}" if len(request.job_uids) > 1 else ""
    tags += [
        {"Key": TAG_PREFIX + "launch", "Value": str(request.launch_number)},
        {"Key": TAG_PREFIX + "market", "Value": request.market},
        {"Key": TAG_PREFIX + "by", "Value": "orch watch"},
        {"Key": "Name", "Value": f"orch-{request.job_uids[0][:40]}{more}-launch-{request.launch_number}"},
    ]
    return tags


def _template_tags(data: Mapping[str, Any], resource: str) -> list[dict[str, str]]:
    """The template's own tags for `resource`, kept (tags given to run-instances for a resource
    type may replace the template's), less those orch sets."""
    out = []
    for spec in data.get("TagSpecifications") or []:
        if spec.get("ResourceType") == resource:
            for tag in spec.get("Tags") or []:
                if not str(tag.get("Key", "")).startswith(TAG_PREFIX) and tag.get("Key") != "Name":
                    out.append({"Key": str(tag["Key"]), "Value": str(tag.get("Value", ""))})
    return out


def lease_instance_id(owner: Mapping[str, Any]) -> Optional[str]:
    """The EC2 instance that held a lease: the id the daemon recorded from the instance metadata, or
    a host name in EC2's resource-based form (i-0123456789abcdef0.ec2.internal)."""
    recorded = owner.get("instance_id")
    if isinstance(recorded, str) and INSTANCE_ID.match(recorded):
        return recorded
    host = str(owner.get("host") or "").split(".")[0]
    return host if INSTANCE_ID.match(host) else None


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Code") or "")
    return ""


__all__ = ["AwsProvider", "launch_tags", "lease_instance_id"]
