"""A zone's spot price from EC2's spot price history, for `[[recovery.zones]]` entries of the `aws`
provider that give no `spot_price`: the newest price of the instance type its launch template
names, in the availability zone its subnet is in (else the zone's name, when it is one), read with
`describe_spot_price_history` and kept TTL_S (spot prices move at most every few minutes; a
controller that asked every pass would be throttled). An answer EC2 does not give -- no type in the
template, no permission, no history -- is None, logged once: the policy then prices the zone by
[pricing], as before."""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime, timezone
from typing import Any, Callable, Optional

log = logging.getLogger("orch.watch")

TTL_S = 300.0  # how long a price read is used
AZ_NAME = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")  # us-east-1a
PRODUCTS = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]


class SpotPriceHistory:
    """zone name -> its spot price per hour now (None: not known)."""

    def __init__(self, provider: Any, clock: Callable[[], float] = time.time):
        self.provider = provider  # aws.AwsProvider: its zones, clients and launch templates
        self.clock = clock
        self._cache: dict[str, tuple[float, Optional[float]]] = {}  # zone -> (read at, price)
        self._said: set[str] = set()

    def price(self, zone: str) -> Optional[float]:
        now = self.clock()
        cached = self._cache.get(zone)
        if cached is not None and now - cached[0] < TTL_S:
            return cached[1]
        try:
            price = self._read(zone, now)
        except Exception as exc:  # any failure: not known now (the policy falls back on [pricing])
            if zone not in self._said:
                self._said.add(zone)
                log.warning("aws provider: zone %s: no spot price from EC2's history: %s", zone, str(exc)[:300])
            price = None
        self._cache[zone] = (now, price)
        return price

    def _read(self, zone: str, now: float) -> Optional[float]:
        region, subnet, template = self.provider.zones[zone]
        ec2 = self.provider._client_of(region)
        _, data = self.provider._template_version(ec2, template)
        instance_type = data.get("InstanceType")
        if not instance_type:
            raise ValueError(f"launch template {template!r} names no InstanceType")
        az = zone if AZ_NAME.match(zone) else None
        if subnet:
            az = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]["AvailabilityZone"]
        if az is None:
            raise ValueError("no subnet, and the zone's name is not an availability zone")
        reply = ec2.describe_spot_price_history(
            InstanceTypes=[instance_type],
            ProductDescriptions=PRODUCTS,
            Filters=[{"Name": "availability-zone", "Values": [az]}],
            StartTime=datetime.fromtimestamp(now, timezone.utc),
            MaxResults=20,
        )
        history = [h for h in reply.get("SpotPriceHistory") or [] if h.get("AvailabilityZone") == az]
        if not history:
            raise ValueError(f"EC2 has no spot price history for {instance_type} in {az}")
        newest = max(history, key=lambda h: str(h.get("Timestamp") or ""))
        return float(newest["SpotPrice"])
