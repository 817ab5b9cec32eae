"""What every channel class shares: identity (name, type, events), secret-safe printing, and
one HTTP POST that turns transport failures and HTTP statuses into NotifyError."""

from __future__ import annotations

import email.utils
import time
from typing import Any, ClassVar, Type

import httpx
from pydantic import SecretStr

from .base import Message, NotifyError
from .config import ChannelConfig
from orchestrator.redaction import redact


class Channel:
    """Base of the channel classes. Subclasses set `type`, `Config`, `secret_keys`, and
    implement `send` and `_target` (where messages go, for describe())."""

    type: ClassVar[str]
    Config: ClassVar[Type[ChannelConfig]]  # typing.Type: `type` is the class attribute above
    secret_keys: ClassVar[tuple[str, ...]] = ()
    min_interval_s: float = 0.0

    def __init__(self, config: ChannelConfig, *, timeout_s: float = 10.0):
        self.config = config
        self.name = config.name or self.type
        self.events = frozenset(config.events)
        self.timeout_s = timeout_s

    def send(self, message: Message) -> None:  # pragma: no cover - every channel overrides
        raise NotImplementedError

    def _target(self) -> str:  # pragma: no cover - every channel overrides
        raise NotImplementedError

    def _secret_values(self) -> list[str]:
        values = []
        for key in self.secret_keys:
            value = getattr(self.config, key, None)
            if isinstance(value, SecretStr):
                values.append(value.get_secret_value())
            elif isinstance(value, str):
                values.append(value)
        return values

    def scrub(self, text: str) -> str:
        return redact(text, self._secret_values())

    def error(
        self,
        provider_message: str,
        *,
        retryable: bool,
        code: int | str | None = None,
        retry_after: float | None = None,
    ) -> NotifyError:
        return NotifyError(
            self.name, self.scrub(provider_message), retryable=retryable, code=code, retry_after=retry_after
        )

    def describe(self) -> str:
        events = ", ".join(sorted(self.events))
        return self.scrub(f"{self.type} '{self.name}' -> {self._target()} (events: {events})")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After is either seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class HttpChannel(Channel):
    """A channel that speaks JSON over HTTP POST."""

    def post_json(
        self, url: str, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[httpx.Response, Any]:
        """POST payload; return (response, parsed JSON body or None). Transport failures raise
        a retryable NotifyError; the HTTP status is left to the caller (providers answer
        errors with HTTP 200 and sometimes throttling with 4xx, so the body decides first)."""
        try:
            # A client per send: nothing global, nothing kept open between rare messages.
            with httpx.Client(timeout=self.timeout_s, follow_redirects=False) as client:
                response = client.post(url, json=payload, headers=headers)
        except httpx.TimeoutException:
            raise self.error(f"no answer within {self.timeout_s:g} s", retryable=True, code="timeout") from None
        except httpx.HTTPError as exc:
            raise self.error(
                f"cannot reach the server: {type(exc).__name__}: {exc}", retryable=True, code="connection"
            ) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        return response, body

    def status_error(self, response: httpx.Response) -> NotifyError | None:
        """None for 2xx; otherwise the NotifyError the HTTP status alone implies."""
        status = response.status_code
        if 200 <= status < 300:
            return None
        snippet = " ".join(response.text.split())[:200]
        text = f"HTTP {status} {response.reason_phrase}" + (f": {snippet}" if snippet else "")
        if status == 429:
            return self.error(
                text, retryable=True, code=status, retry_after=parse_retry_after(response.headers.get("retry-after"))
            )
        # 408 and 5xx are the server's trouble, not ours; 401/403/404 mean a wrong key or URL.
        return self.error(text, retryable=status == 408 or status >= 500, code=status)

    def unreadable_body(self, response: httpx.Response) -> NotifyError:
        # A 2xx that is not the provider's JSON is usually a proxy or captive portal: transient.
        snippet = " ".join(response.text.split())[:200]
        return self.error(
            f"HTTP {response.status_code} but the answer is not the provider's JSON: {snippet!r}",
            retryable=True,
            code="bad-response",
        )
