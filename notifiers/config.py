"""Turning one `[[notifiers]]` table into a validated channel config: `*_env` secrets resolved
from the environment, pydantic models with extra="forbid", one plain line per problem."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from orchestrator.spec.problems import problems_from

from .base import DEFAULT_EVENTS, EVENT_KINDS
from orchestrator.redaction import redact

EventName = Literal[EVENT_KINDS]  # type: ignore[valid-type]


class ChannelConfig(BaseModel):
    """Keys every channel takes. Subclasses add their own; unknown keys are errors."""

    # hide_input_in_errors: a ValidationError must never carry a secret's value.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    type: str
    name: str | None = Field(default=None, min_length=1)
    events: list[EventName] = Field(default_factory=lambda: sorted(DEFAULT_EVENTS))


def secret(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""


def check_http_url(url: str) -> None:
    """Raise ValueError (with the URL redacted) unless url is an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL (got {redact(url)!r})")


def query_param(url: str, name: str) -> str:
    values = parse_qs(urlsplit(url).query).get(name) or [""]
    return values[0]


def resolve_secrets(
    data: dict[str, Any], secret_keys: tuple[str, ...], env: Mapping[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """Replace `KEY_env = "VAR"` by `KEY = <value of VAR>`; return (data, problems)."""
    data, problems = dict(data), []
    for key in secret_keys:
        env_key = f"{key}_env"
        if env_key not in data:
            continue
        var = data.pop(env_key)
        if not isinstance(var, str) or not var:
            problems.append(f"{env_key}: must name an environment variable (got {var!r})")
        elif key in data:
            problems.append(f"{env_key}: give either {key} or {env_key}, not both")
        elif not env.get(var):
            problems.append(f"{env_key}: environment variable {var} is not set (export it in the daemon's environment)")
        else:
            data[key] = env[var]
    return data, problems


def validate_config(
    model: type[ChannelConfig],
    raw: dict[str, Any],
    secret_keys: tuple[str, ...],
    env: Mapping[str, str],
    label: str,
) -> tuple[ChannelConfig | None, list[str]]:
    """Validate one notifier table; every problem comes back prefixed with label."""
    data, env_problems = resolve_secrets(raw, secret_keys, env)
    problems = [f"{label}: {p}" for p in env_problems]
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        for line in problems_from(exc, model, label):
            key = line[len(label) + 2 :].split(":", 1)[0]
            # An env-resolved secret that failed resolution is reported once, above.
            if key in secret_keys and any(p.startswith(f"{key}_env:") for p in env_problems):
                continue
            if key in secret_keys and line.endswith(": is required"):
                line += f' (or {key}_env = "VARIABLE" naming an environment variable)'
            problems.append(line)
        return None, problems
    return (None, problems) if problems else (config, [])
