"""The markets a job's machine can be bought on, named once: the controller's policy, the launch
request, the providers' tags, the manifest and the bill all spell them from here."""

from __future__ import annotations

SPOT = "spot"  # cheap, reclaimed when the cloud wants it back, sometimes not to be had at all
ON_DEMAND = "on-demand"  # full price, certain
IDLE = "idle"  # no machine: the job waits, free (only the policy says it; nothing is bought)

MARKETS = (SPOT, ON_DEMAND)  # what a machine can be launched on
