"""The markets a job's machine can be bought on, named once: the controller's policy, the launch
request, the providers' tags, the manifest and the bill all spell them from here."""

from __future__ import annotations

import re

SPOT = "spot"  # cheap, reclaimed when the cloud wants it back, sometimes not to be had at all
ON_DEMAND = "on-demand"  # full price, certain
IDLE = "idle"  # no machine: the job waits, free (only the policy says it; nothing is bought)

MARKETS = (SPOT, ON_DEMAND)  # what a machine can be launched on

# A [[recovery.zones]] name: what the config accepts, and all a zone read back from the bucket (a
# launch claim) may be to be shown.
ZONE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ZONE_NAME = re.compile(ZONE_NAME_PATTERN)
