"""WeChat-family channels: ServerChan (Turbo and ServerChan³), the WeCom group robot, PushPlus.
All three answer errors with HTTP 200 and a code in the JSON body, so the body decides."""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from typing import Any

from pydantic import Field, SecretStr, field_validator

from .base import Message, NotifyError, truncate_utf8
from .channel import HttpChannel
from .config import ChannelConfig, check_http_url, query_param, secret
from orchestrator.redaction import redact

# ---- ServerChan ------------------------------------------------------------------------

_SC3_KEY = re.compile(r"^sctp(\d+)t")
_SENDKEY_CHARS = re.compile(r"^[A-Za-z0-9_-]+$")


class ServerChanConfig(ChannelConfig):
    sendkey: SecretStr
    # Replaces scheme and host. "{uid}" is filled in for ServerChan³ keys.
    base_url: str | None = None

    @field_validator("sendkey")
    @classmethod
    def _sendkey_shape(cls, value: SecretStr) -> SecretStr:
        key = value.get_secret_value()
        if not _SENDKEY_CHARS.match(key):
            raise ValueError("must be the SendKey from sct.ftqq.com or sc3.ft07.com (letters and digits only)")
        if key.startswith("sctp") and not _SC3_KEY.match(key):
            raise ValueError("looks like a ServerChan³ key (starts with 'sctp') but has no uid; copy the whole key")
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_http_url(value.replace("{uid}", "0"))
        return value


class ServerChanNotifier(HttpChannel):
    """ServerChan: `sctp<uid>t…` keys go to ServerChan³, any other key to Turbo (the routing
    rule of the official SDKs)."""

    type = "serverchan"
    Config = ServerChanConfig
    secret_keys = ("sendkey",)
    config: ServerChanConfig

    def url(self) -> str:
        key = secret(self.config.sendkey)
        sc3 = _SC3_KEY.match(key)
        if sc3:
            base = self.config.base_url or "https://{uid}.push.ft07.com"
            return f"{base.rstrip('/').replace('{uid}', sc3.group(1))}/send/{key}.send"
        base = self.config.base_url or "https://sctapi.ftqq.com"
        return f"{base.rstrip('/')}/{key}.send"

    def _target(self) -> str:
        return self.url()

    def send(self, message: Message) -> None:
        # title: at most 32 characters; desp: Markdown, at most 32 KB.
        payload = {"title": message.title()[:32], "desp": truncate_utf8(message.markdown(), 32 * 1024)}
        response, body = self.post_json(self.url(), payload)
        if isinstance(body, dict) and "code" in body:
            if body["code"] == 0:
                return
            text = str(body.get("message") or body.get("info") or body)
            raise self.error(text, retryable=response.status_code >= 500, code=body["code"])
        raise self.status_error(response) or self.unreadable_body(response)


# ---- WeCom group robot ------------------------------------------------------------------

_WECOM_MARKDOWN_MAX_BYTES = 4096
_WECOM_RETRYABLE = {-1: None, 45009: 60.0}  # -1 system busy; 45009 api freq out of limit
_WECOM_IMAGE_MAX_BYTES = 2 * 1024 * 1024  # before base64; JPG or PNG

log = logging.getLogger("orch.notify")


class WeComConfig(ChannelConfig):
    url: SecretStr  # the robot's webhook URL; the key= in it is the only credential

    @field_validator("url")
    @classmethod
    def _has_key(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        check_http_url(url)
        if not query_param(url, "key"):
            raise ValueError(
                "must be the robot's webhook URL including ?key=... (group chat -> robot -> copy webhook address)"
            )
        return value


class WeComNotifier(HttpChannel):
    type = "wecom"
    Config = WeComConfig
    secret_keys = ("url",)
    min_interval_s = 3.0  # at most 20 messages per minute per robot
    config: WeComConfig

    def _target(self) -> str:
        return redact(secret(self.config.url))

    def send(self, message: Message) -> None:
        content = truncate_utf8(message.markdown(code_blocks=False), _WECOM_MARKDOWN_MAX_BYTES)
        payload = {"msgtype": "markdown", "markdown": {"content": content}}
        response, body = self.post_json(secret(self.config.url), payload)
        check_errcode(self, response, body, _WECOM_RETRYABLE)
        png = message.curve_png()
        if png and len(png) <= _WECOM_IMAGE_MAX_BYTES:
            self._send_image(png)

    def _send_image(self, png: bytes) -> None:
        """The loss curve as a second message (WeCom's image type: base64 + md5 of the raw bytes).
        Best effort: the text was delivered, and resending it for a picture would duplicate it."""
        image = {
            "msgtype": "image",
            "image": {"base64": base64.b64encode(png).decode(), "md5": hashlib.md5(png).hexdigest()},
        }
        try:
            response, body = self.post_json(secret(self.config.url), image)
            check_errcode(self, response, body, _WECOM_RETRYABLE)
        except NotifyError as exc:
            log.warning("%s: the loss-curve picture was not delivered (the text was): %s", self.name, exc)


def check_errcode(channel: HttpChannel, response: Any, body: Any, retryable: dict[int, float | None]) -> None:
    """The WeCom/DingTalk envelope: {"errcode": 0, "errmsg": "ok"} even for errors on HTTP 200."""
    if isinstance(body, dict) and "errcode" in body:
        code = body["errcode"]
        if code == 0:
            return
        message = str(body.get("errmsg") or "no errmsg")
        raise channel.error(
            message,
            retryable=code in retryable or response.status_code >= 500,
            code=code,
            retry_after=retryable.get(code),
        )
    raise channel.status_error(response) or channel.unreadable_body(response)


# ---- PushPlus ---------------------------------------------------------------------------

# 900: too many requests (the doc says stop for the day); 500: system error.
_PUSHPLUS_RETRYABLE = {500: None, 900: 3600.0}


class PushPlusConfig(ChannelConfig):
    token: SecretStr
    topic: str | None = Field(default=None, min_length=1)
    channel: str | None = Field(default=None, min_length=1)  # wechat (default), webhook, cp, mail, sms
    base_url: str = "https://www.pushplus.plus"

    @field_validator("token")
    @classmethod
    def _token_shape(cls, value: SecretStr) -> SecretStr:
        if not re.fullmatch(r"[A-Za-z0-9]{8,}", value.get_secret_value()):
            raise ValueError("must be the PushPlus token (letters and digits, from pushplus.plus -> 一对一推送)")
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        check_http_url(value)
        return value


class PushPlusNotifier(HttpChannel):
    """PushPlus accepts asynchronously: code 200 means "queued by PushPlus", not "on the phone"."""

    type = "pushplus"
    Config = PushPlusConfig
    secret_keys = ("token",)
    config: PushPlusConfig

    def _target(self) -> str:
        topic = f" topic {self.config.topic}" if self.config.topic else ""
        return f"{self.config.base_url.rstrip('/')}/send{topic}"

    def send(self, message: Message) -> None:
        payload: dict[str, Any] = {
            "token": secret(self.config.token),
            "title": message.title(),
            "content": message.html(),
            "template": "html",
        }
        if self.config.topic:
            payload["topic"] = self.config.topic
        if self.config.channel:
            payload["channel"] = self.config.channel
        response, body = self.post_json(f"{self.config.base_url.rstrip('/')}/send", payload)
        if isinstance(body, dict) and "code" in body:
            code = body["code"]
            if code == 200:
                return
            raise self.error(
                str(body.get("msg") or body),
                retryable=code in _PUSHPLUS_RETRYABLE or response.status_code >= 500,
                code=code,
                retry_after=_PUSHPLUS_RETRYABLE.get(code),
            )
        raise self.status_error(response) or self.unreadable_body(response)
