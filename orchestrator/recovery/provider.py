"""The provider interface the recovery controller calls: launch a replacement machine for some
jobs, stop a machine that is no longer wanted, and (where the provider can tell) say whether the
old machine is really gone. `build_provider` (build.py) returns the configured one.

A launch ends one of three ways: a `Launched` record (the machine's id, which `stop` and `alive`
get later, and the provider's own words); `NoCapacity` -- the market
has no machine to give now (a market signal: the job waits, free, and the try does not count
toward max_launches); or `RelaunchError` -- a real failure (bad template, quota, credentials),
which backs off and counts."""

from __future__ import annotations

import re
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
class Launched:
    """What a launch brought up: `instance_id` is what `stop` and `alive` are given for it (an EC2
    instance id, the launch command's `instance=` line); `text` is what the provider said."""

    instance_id: str
    text: str = ""


INSTANCE_LINE = re.compile(r"^\s*instance=(\S{1,200})\s*$")


def launched_from_output(output: str) -> Launched:
    """The `command` provider's rule (docs/recovery-providers.md): a line `instance=<id>` anywhere in
    the output (the last such line), else the whole last non-empty line is the id."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    named = [m.group(1) for m in (INSTANCE_LINE.match(line) for line in lines) if m]
    last = lines[-1][:200] if lines else ""
    return Launched(named[-1] if named else last, last)


def as_launched(value: "Launched | str") -> Launched:
    """A provider's answer as a record (a provider written before `Launched` returns its text)."""
    return value if isinstance(value, Launched) else launched_from_output(str(value))


@dataclass(frozen=True)
class LaunchRequest:
    url: str  # the mirror
    job_uids: tuple[str, ...]
    market: str  # "spot" | "on-demand"
    launch_number: int  # 1, 2, ... for these jobs (the first job's, when several go together)
    gpus: int = 0  # the GPUs the jobs need together: the machine to launch (0: not said)
    zone: str = ""  # with [[recovery.zones]]: the zone to launch in ("": the provider's own)
    price: Optional[float] = None  # that zone's price per hour on `market`, where the config says
    # [storage] signing_key_env: the variable the new machine must hold the bucket key in (its name only)
    signing_key_env: str = ""


class Provider(Protocol):
    name: str
    can_stop: bool  # False: `stop` is not configured (the machine's own [idle] shutdown powers it off)

    def launch(self, request: LaunchRequest) -> Launched:
        """Launch a machine that will adopt `request.job_uids`; return its id and the provider's
        words. Raise RelaunchError on failure (NoCapacity: none on that market now)."""
        ...

    def stop(self, instance_id: str) -> str:
        """Stop (terminate) the machine `instance_id` -- a `Launched.instance_id`, or an owner
        record's instance id -- so it no longer bills; return what was done. Raise StopError."""
        ...

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        """`owner` is the manifest's owner record (or {"instance_id": id} for a machine this
        controller launched). True: gone; False: alive; None: cannot tell."""
        ...
