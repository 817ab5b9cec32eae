"""Masking secrets in text that leaves the process (logs, exceptions, `describe()`, event
details). Several providers put the credential in the URL itself, so URLs are never printed raw."""

from __future__ import annotations

import re

MASK = "***"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # Query parameters and env assignments that carry credentials: WeCom key=, DingTalk
    # access_token= and sign=, HF_TOKEN=..., WANDB_API_KEY=...
    (
        re.compile(r"(?i)\b(\w*?(?:token|key|secret|sign|password|passwd|auth))=([^&\s\"'#<>]+)"),
        rf"\1={MASK}",
    ),
    # Feishu / Lark custom bot: the token is the last path segment of the hook URL.
    (re.compile(r"(/open-apis/bot/v2/hook/)[^/?\s\"'#<>]+"), rf"\1{MASK}"),
    # ServerChan keys wherever they appear (path of a Turbo URL, SC3 URL, or bare).
    (re.compile(r"\bsctp\d+t[A-Za-z0-9_-]+"), f"sctp{MASK}"),
    (re.compile(r"\bSC[TU]\d+T[A-Za-z0-9_-]+"), f"SCT{MASK}"),
    # PushPlus /send/<token> form.
    (re.compile(r"(/send/)[A-Za-z0-9]{16,}"), rf"\1{MASK}"),
    # user:password@host in any URL.
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@"), rf"\1{MASK}@"),
    # Authorization header values.
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {MASK}"),
]


def redact(text: str) -> str:
    """Mask credentials that commonly appear in notifier URLs, headers and errors."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def scrub(text: str, secrets: list[str]) -> str:
    """redact(), and also mask these exact values (a secret can be any string, e.g. a password)."""
    for secret in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return redact(text)
