"""`build_provider(recovery_config)`: the provider config.toml's [recovery] provider names.

Its own module so that recovery/ has no import circle: the providers import the interface
(provider.py), and only this module imports the providers. The `aws` provider is imported here
lazily, when it is configured, so boto3 stays an optional extra."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .provider import Provider, RelaunchError

if TYPE_CHECKING:
    from orchestrator.spec.config import RecoverySection


def build_provider(recovery_config: "RecoverySection") -> Provider:
    """The provider named by config.toml's [recovery] provider."""
    name = recovery_config.provider
    if name == "command":
        from .command import CommandProvider

        return CommandProvider(
            recovery_config.launch,
            stop_argv=recovery_config.stop,
            alive_argv=recovery_config.alive,
            timeout_s=recovery_config.launch_timeout_minutes * 60,
        )
    if name == "aws":
        from .aws import AwsProvider

        return AwsProvider(recovery_config.aws, recovery_config.zones)
    raise RelaunchError(f"unknown recovery provider {name!r} (config.toml [recovery] provider)")
