"""Chat-robot and generic webhooks: Feishu/Lark custom bot, DingTalk custom robot (both with
optional signing), and a plain JSON POST of the event for anything else."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote_plus, urlsplit

from pydantic import Field, SecretStr, field_validator

from .base import Message, truncate_utf8
from .channel import HttpChannel
from .config import ChannelConfig, check_http_url, query_param, secret
from orchestrator.redaction import redact
from .wechat import check_errcode

# ---- signatures (both documented as HMAC-SHA256 over "timestamp\nsecret", base64) -------


def feishu_sign(timestamp_s: int, secret_value: str) -> str:
    # Feishu keys the HMAC with the string to sign and hashes an empty message.
    string_to_sign = f"{timestamp_s}\n{secret_value}".encode("utf-8")
    return base64.b64encode(hmac.new(string_to_sign, b"", hashlib.sha256).digest()).decode("ascii")


def dingtalk_sign(timestamp_ms: int, secret_value: str) -> str:
    # DingTalk keys the HMAC with the secret and hashes the string to sign; the caller URL-encodes.
    string_to_sign = f"{timestamp_ms}\n{secret_value}".encode("utf-8")
    digest = hmac.new(secret_value.encode("utf-8"), string_to_sign, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


# ---- Feishu / Lark ----------------------------------------------------------------------

_FEISHU_MAX_BODY_BYTES = 20 * 1024
_FEISHU_THROTTLED = 11232


class SignedBot(HttpChannel):
    """A group robot whose URL may carry an optional signing secret (Feishu, DingTalk): signs with
    the injected clock, so tests can check the signature independently."""

    def __init__(self, config: Any, *, timeout_s: float = 10.0, clock: Callable[[], float] = time.time):
        super().__init__(config, timeout_s=timeout_s)
        self._clock = clock

    def _target(self) -> str:
        config: Any = self.config  # a subclass's Config: url and secret
        signed = ", signed" if config.secret else ""
        return redact(secret(config.url)) + signed


class FeishuConfig(ChannelConfig):
    url: SecretStr  # https://open.feishu.cn/open-apis/bot/v2/hook/<token> (the token is the secret)
    secret: SecretStr | None = None

    @field_validator("url")
    @classmethod
    def _hook_url(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        check_http_url(url)
        if not urlsplit(url).path.strip("/"):
            raise ValueError("must be the bot's webhook URL ending in /open-apis/bot/v2/hook/<token>")
        return value


class FeishuNotifier(SignedBot):
    type = "feishu"
    Config = FeishuConfig
    secret_keys = ("url", "secret")
    min_interval_s = 0.6  # 100 requests/min and 5/s per bot
    config: FeishuConfig

    def send(self, message: Message) -> None:
        # Plain text is the one type every bot accepts; Feishu text has no Markdown.
        text = truncate_utf8(message.text(), _FEISHU_MAX_BODY_BYTES - 512)
        payload: dict[str, Any] = {"msg_type": "text", "content": {"text": text}}
        if self.config.secret:
            timestamp = int(self._clock())
            payload["timestamp"] = str(timestamp)
            payload["sign"] = feishu_sign(timestamp, secret(self.config.secret))
        response, body = self.post_json(secret(self.config.url), payload)
        if isinstance(body, dict) and ("code" in body or "StatusCode" in body):
            code = body.get("code", body.get("StatusCode"))
            if code == 0:
                return
            text = str(body.get("msg") or body.get("StatusMessage") or body)
            # 9499 is documented as "Bad Request" but users report it for rate limiting too.
            throttled = code == _FEISHU_THROTTLED or (code == 9499 and "too many" in text.lower())
            raise self.error(
                text,
                retryable=throttled or response.status_code >= 500,
                code=code,
                retry_after=60.0 if throttled else None,
            )
        raise self.status_error(response) or self.unreadable_body(response)


# ---- DingTalk ---------------------------------------------------------------------------

# 130101: more than 20 messages a minute; the robot is throttled for 10 minutes.
_DINGTALK_RETRYABLE = {-1: None, 130101: 600.0}


class DingTalkConfig(ChannelConfig):
    url: SecretStr  # https://oapi.dingtalk.com/robot/send?access_token=...
    secret: SecretStr | None = None

    @field_validator("url")
    @classmethod
    def _has_token(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        check_http_url(url)
        if not query_param(url, "access_token"):
            raise ValueError("must be the robot's webhook URL including ?access_token=...")
        return value

    @field_validator("secret")
    @classmethod
    def _sec_prefix(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith("SEC"):
            raise ValueError("must be the robot's signing secret, which starts with 'SEC' (加签)")
        return value


class DingTalkNotifier(SignedBot):
    type = "dingtalk"
    Config = DingTalkConfig
    secret_keys = ("url", "secret")
    min_interval_s = 3.0  # 20 messages per minute per robot; more mutes it for 10 minutes
    config: DingTalkConfig

    def send(self, message: Message) -> None:
        payload = {"msgtype": "markdown", "markdown": {"title": message.title(), "text": message.markdown()}}
        url = secret(self.config.url)
        if self.config.secret:
            timestamp = int(self._clock() * 1000)
            sign = quote_plus(dingtalk_sign(timestamp, secret(self.config.secret)))
            url = f"{url}&timestamp={timestamp}&sign={sign}"
        response, body = self.post_json(url, payload)
        check_errcode(self, response, body, _DINGTALK_RETRYABLE)


# ---- generic webhook --------------------------------------------------------------------


class WebhookConfig(ChannelConfig):
    url: SecretStr
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, value: SecretStr) -> SecretStr:
        check_http_url(value.get_secret_value())
        return value


class WebhookNotifier(HttpChannel):
    """POSTs {"event", "title", "text", "markdown", "message": {...}}; any 2xx is success."""

    type = "webhook"
    Config = WebhookConfig
    secret_keys = ("url",)
    config: WebhookConfig

    def _secret_values(self) -> list[str]:
        # Header values are often bearer tokens: treat them all as secrets.
        return super()._secret_values() + [secret(v) for v in self.config.headers.values()]

    def _target(self) -> str:
        headers = f", headers: {', '.join(sorted(self.config.headers))}" if self.config.headers else ""
        # Only scheme and host: services put tokens anywhere in the path (Slack, Discord, ...).
        parts = urlsplit(secret(self.config.url))
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…{headers}"

    def send(self, message: Message) -> None:
        payload = {
            "event": message.event,
            "title": message.title(),
            "text": message.text(),
            "markdown": message.markdown(),
            # The log tail is masked like in every other rendering.
            "message": {**message.to_dict(), "log_tail": "\n".join(message.log_lines())},
        }
        headers = {k: secret(v) for k, v in self.config.headers.items()}
        response, _ = self.post_json(secret(self.config.url), payload, headers=headers)
        error = self.status_error(response)
        if error is not None:
            raise error
