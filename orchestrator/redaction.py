"""The one rule for masking secrets in text that leaves a process: logs, exceptions, notifications,
tracker notes, store errors, the dashboard's provenance pages and the diff.patch the mirror uploads.
Standard library only, beside contract.py: training/ imports it before torch, the notifiers and the
daemon alike, so every masker masks the same things (docs/security.md)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Optional

MASK = "***"

# Variables whose values are credentials: their exact values are masked wherever they appear,
# even where no pattern below would recognise them (a token as a path segment, a bare password).
SECRET_ENV = (
    "WANDB_API_KEY",
    "SWANLAB_API_KEY",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH",
    "DATABRICKS_TOKEN",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCESS_KEY",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
)

# A name that says it holds a credential: WeCom key=, DingTalk access_token= and sign=, S3's
# X-Amz-Signature= and X-Amz-Credential=, HF_TOKEN=, api_key: "...", password = '...'.
_NAME = r"[\w.-]*?(?:token|key|secret|sign|signature|password|passwd|auth|credentials?|sig)"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # name=value, name: value, "name": "value", name = 'value' (but not `key == other`).
    (
        re.compile(rf"(?i)\b({_NAME}[\"']?\s*(?:=(?!=)|:(?!//))\s*[\"']?)[^\s\"'&,;#<>]+"),
        rf"\1{MASK}",
    ),
    # Feishu / Lark custom bot: the token is the last path segment of the hook URL.
    (re.compile(r"(/open-apis/bot/v2/hook/)[^/?\s\"'#<>]+"), rf"\1{MASK}"),
    # ServerChan keys wherever they appear (path of a Turbo URL, SC3 URL, or bare).
    (re.compile(r"\bsctp\d+t[A-Za-z0-9_-]+"), f"sctp{MASK}"),
    (re.compile(r"\bSC[TU]\d+T[A-Za-z0-9_-]+"), f"SCT{MASK}"),
    # PushPlus /send/<token> form.
    (re.compile(r"(/send/)[A-Za-z0-9]{16,}"), rf"\1{MASK}"),
    # user:password@host (or a bare token@host) in any URL: the whole user part goes.
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"'<>]+@"), rf"\1{MASK}@"),
    # Authorization header values.
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {MASK}"),
    # Well-known key shapes, named or not: AWS access key ids, Hugging Face, OpenAI, GitHub tokens.
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), MASK),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}\b"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), MASK),
]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with credentials masked: these exact `secrets` (a secret can be any string, e.g. a
    password; values under 4 characters are left, they would mask ordinary words), then every
    pattern above."""
    for secret in sorted((s for s in secrets if s and len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# Any other variable whose name ends like a credential's (ORCH_SMTP_PASSWORD, MY_WEBHOOK_KEY); a
# suffix, not a substring: TOKENIZERS_PARALLELISM=false must not mask every "false".
_SECRET_SUFFIX = re.compile(r"(?i)(?:^|_)(?:key|token|secret|password|passwd|credentials?)$")


def is_secret_name(name: str) -> bool:
    """Whether a variable of this name holds a credential: one of SECRET_ENV, or named like one.
    The same rule decides what a cluster job is given only through its secret file (docs/ray.md)."""
    return name in SECRET_ENV or _SECRET_SUFFIX.search(name) is not None


def environ_secrets(environ: Mapping[str, str]) -> list[str]:
    """The values of the SECRET_ENV variables, and of any variable named like a credential, set in
    `environ`, for redact(text, secrets)."""
    named = [name for name in environ if name not in SECRET_ENV and is_secret_name(name)]
    return [value for name in (*SECRET_ENV, *named) if (value := environ.get(name))]


def shown_command(argv: Iterable[str], environ: Optional[Mapping[str, str]] = None) -> str:
    """An attempt's command as its log's first line shows it: a `--token=hf_...` typed into the
    command, or the value of a credential variable of `environ` (default: this process's), masked."""
    return redact(" ".join(argv), environ_secrets(os.environ if environ is None else environ))
