"""Optional bridge to Apprise (any of its ~150 services) when the `apprise` package is installed.
Apprise reports only true/false and, for several Chinese bots, never reads the provider's
error code, so the built-in channels are preferred where one exists."""

from __future__ import annotations

import importlib.util

import re

from pydantic import Field, SecretStr, field_validator

from .base import Message
from .channel import Channel
from .config import ChannelConfig
from orchestrator.redaction import redact


def apprise_installed() -> bool:
    return importlib.util.find_spec("apprise") is not None


class AppriseConfig(ChannelConfig):
    # Apprise URLs carry their credentials (e.g. "tgram://bottoken/chatid"): all secret.
    urls: list[SecretStr] = Field(min_length=1)

    @field_validator("urls", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        # urls_env names one variable; Apprise's own convention separates URLs by space or comma.
        return [u for u in re.split(r"[\s,]+", value) if u] if isinstance(value, str) else value


class AppriseNotifier(Channel):
    type = "apprise"
    Config = AppriseConfig
    secret_keys = ("urls",)
    config: AppriseConfig

    def _secret_values(self) -> list[str]:
        return [u.get_secret_value() for u in self.config.urls]

    def _target(self) -> str:
        # Only the scheme of each URL: everything after it may be a credential.
        return ", ".join(redact(u.get_secret_value()).split("://", 1)[0] + "://***" for u in self.config.urls)

    def send(self, message: Message) -> None:
        import apprise  # optional dependency, imported only when this channel is used

        client = apprise.Apprise()
        for url in self.config.urls:
            if not client.add(url.get_secret_value()):
                raise self.error("Apprise does not understand one of the urls", retryable=False, code="bad-url")
        if not client.notify(title=message.title(), body=message.text()):
            raise self.error(
                "Apprise reported a failed delivery (see its log for the service's answer)", retryable=True, code=None
            )
