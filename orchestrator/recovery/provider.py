"""The provider interface the recovery controller calls: launch a replacement machine for some
jobs, stop a machine that is no longer wanted, and (where the provider can tell) say whether the
old machine is really gone. `build_provider` (build.py) returns the configured one.

A launch ends one of three ways: a description of what was launched; `NoCapacity` -- the market
has no machine to give now (a market signal: the job waits, free, and the try does not count
toward max_launches); or `RelaunchError` -- a real failure (bad template, quota, credentials),
which backs off and counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

from orchestrator.model.errors import OrchError


class RelaunchError(OrchError):
    """The provider could not launch a machine (the message says why; never a secret)."""


class NoCapacity(RelaunchError):
    """The market has no capacity for this machine now (EC2's InsufficientInstanceCapacity, a
    launch command's exit 69): not a failed launch, a signal that the market is unavailable."""


class StopError(OrchError):
    """The provider could not stop a machine (the message says why; never a secret)."""


@dataclass(frozen=True)
class LaunchRequest:
    url: str  # the mirror
    job_uids: tuple[str, ...]
    market: str  # "spot" | "on-demand"
    launch_number: int  # 1, 2, ... for these jobs (the first job's, when several go together)
    gpus: int = 0  # the GPUs the jobs need together: the machine to launch (0: not said)
    zone: str = ""  # with [[recovery.zones]]: the zone to launch in ("": the provider's own)
    price: Optional[float] = None  # that zone's price per hour on `market`, where the config says


class Provider(Protocol):
    name: str
    can_stop: bool  # False: `stop` is not configured (the machine's own [idle] shutdown powers it off)

    def launch(self, request: LaunchRequest) -> str:
        """Launch a machine that will adopt `request.job_uids`; return a description of what was
        launched (an instance id, ...). Raise RelaunchError on failure."""
        ...

    def stop(self, instance_id: str) -> str:
        """Stop (terminate) the machine `instance_id` -- what `launch` returned, or an owner
        record's instance id -- so it no longer bills; return what was done. Raise StopError."""
        ...

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        """`owner` is the manifest's owner record. True: gone; False: alive; None: cannot tell."""
        ...
