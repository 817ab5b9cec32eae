"""The provider interface the recovery controller calls: launch a replacement machine for some
jobs, and (where the provider can tell) say whether the old machine is really gone.

`build_provider(recovery_config)` returns the configured provider; the `aws` provider is imported
lazily so boto3 stays an optional extra."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol

from orchestrator.errors import OrchError

if TYPE_CHECKING:
    from orchestrator.config import RecoverySection


class RelaunchError(OrchError):
    """The provider could not launch a machine (the message says why; never a secret)."""


@dataclass(frozen=True)
class LaunchRequest:
    url: str  # the mirror
    job_uids: tuple[str, ...]
    market: str  # "spot" | "on-demand"
    launch_number: int  # 1, 2, ... for these jobs


class Provider(Protocol):
    name: str

    def launch(self, request: LaunchRequest) -> str:
        """Launch a machine that will adopt `request.job_uids`; return a description of what was
        launched (an instance id, ...). Raise RelaunchError on failure."""
        ...

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        """`owner` is the manifest's owner record. True: gone; False: alive; None: cannot tell."""
        ...


def build_provider(recovery_config: "RecoverySection") -> Provider:
    """The provider named by config.toml's [recovery] provider."""
    # Imported by name, lazily: the providers import this module (no import circle), and the aws
    # provider's boto3 is an optional extra.
    name = recovery_config.provider
    if name == "command":
        command = importlib.import_module("orchestrator.recovery.command")
        return command.CommandProvider(recovery_config.launch)
    if name == "aws":
        aws = importlib.import_module("orchestrator.recovery.aws")
        return aws.AwsProvider(recovery_config.aws)
    raise RelaunchError(f"unknown recovery provider {name!r} (config.toml [recovery] provider)")
