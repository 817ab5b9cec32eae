"""Notification channels: `build_notifiers(config["notifiers"])` validates every
`[[notifiers]]` table and returns one Notifier per table, ready for the outbox to call."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.redaction import redact

from .apprise_channel import AppriseNotifier, apprise_installed
from .base import DEFAULT_EVENTS, EVENT_KINDS, Message, Notifier, NotifierConfigError, NotifyError
from .channel import Channel
from .config import validate_config
from .email import EmailNotifier
from .webhook import DingTalkNotifier, FeishuNotifier, WebhookNotifier
from .wechat import PushPlusNotifier, ServerChanNotifier, WeComNotifier

CHANNELS: dict[str, type[Channel]] = {
    cls.type: cls
    for cls in (
        EmailNotifier,
        ServerChanNotifier,
        WeComNotifier,
        PushPlusNotifier,
        FeishuNotifier,
        DingTalkNotifier,
        WebhookNotifier,
        AppriseNotifier,
    )
}

__all__ = [
    "CHANNELS",
    "DEFAULT_EVENTS",
    "EVENT_KINDS",
    "Message",
    "Notifier",
    "NotifierConfigError",
    "NotifyError",
    "build_notifiers",
    "secrets_in_the_file",
]


def build_notifiers(
    raw: list[dict[str, Any]],
    label: str = "config.toml",
    env: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> list[Notifier]:
    """One notifier per table, in order. Raises NotifierConfigError listing every problem,
    each line naming the file, the table's index and the notifier's name."""
    env = os.environ if env is None else env
    problems: list[str] = []
    built: list[Notifier] = []
    seen: dict[str, int] = {}
    if not isinstance(raw, list):
        raise NotifierConfigError([f"{label}: notifiers: must be a list of [[notifiers]] tables"])
    for index, table in enumerate(raw):
        where = f"{label}: notifiers[{index}]"
        if not isinstance(table, dict):
            problems.append(f"{where}: must be a table ([[notifiers]])")
            continue
        kind = table.get("type")
        name = table.get("name") if isinstance(table.get("name"), str) else kind
        where = f"{where} ({name})" if isinstance(name, str) and name else where
        if isinstance(name, str) and name:
            if name in seen:
                problems.append(
                    f"{where}: name '{name}' is already used by notifiers[{seen[name]}]; "
                    "give each notifier a unique name"
                )
            seen.setdefault(name, index)
        cls = CHANNELS.get(kind) if isinstance(kind, str) else None
        if cls is None:
            problems.append(f"{where}: {_unknown_type(kind, table)}")
            continue
        if cls is AppriseNotifier and not apprise_installed():
            problems.append(f"{where}: type 'apprise' needs the apprise package: pip install 'orch-gpu[apprise]'")
            continue
        config, found = validate_config(cls.Config, table, cls.secret_keys, env, where)
        problems += found
        if config is None:
            continue
        built.append(cls(config, timeout_s=timeout_s))
    if problems:
        raise NotifierConfigError(problems)
    return built


def _unknown_type(kind: object, table: Mapping[str, Any]) -> str:
    known = ", ".join(sorted(CHANNELS))
    if kind is None:
        # `kind = "wecom"`, `typ = ...`: a key near "type", or one whose value names a channel
        near_keys = difflib.get_close_matches("type", [k for k in table if isinstance(k, str)], n=1, cutoff=0.6)
        named = [k for k, v in table.items() if isinstance(v, str) and v in CHANNELS and k != "name"]
        guess = (near_keys or named or [""])[0]
        if guess:
            return f"type: is required; {guess} = {table[guess]!r}: did you mean 'type'? (one of {known})"
        return f"type: is required (one of {known})"
    near = difflib.get_close_matches(str(kind), list(CHANNELS), n=1, cutoff=0.6) if isinstance(kind, str) else []
    hint = f"did you mean '{near[0]}'? " if near else ""
    return f"type: unknown notifier type {kind!r} ({hint}known types: {known})"


def secrets_in_the_file(raw: list[dict[str, Any]], label: str = "config.toml") -> list[str]:
    """A warning per secret written into config.toml itself (`password = "…"`), naming the `*_env`
    form and a variable to export instead: the file is read by backups, editors and `cat`, and the
    docs promise secrets never go there. A URL counts only when it carries a credential."""
    warnings: list[str] = []
    for index, table in enumerate(raw if isinstance(raw, list) else []):
        kind = table.get("type") if isinstance(table, dict) else None
        cls = CHANNELS.get(kind) if isinstance(kind, str) else None
        if cls is None:
            continue
        name = table.get("name") if isinstance(table.get("name"), str) else cls.type
        for key in cls.secret_keys:
            value = table.get(key)
            if not value:
                continue
            if key in ("url", "urls") and all(redact(str(v)) == str(v) for v in _as_list(value)):
                continue  # a plain https://example.com/hook: nothing secret in it
            var = "ORCH_" + re.sub(r"[^A-Z0-9]+", "_", f"{name}_{key}".upper()).strip("_")
            warnings.append(
                f"{label}: notifiers[{index}] ({name}): {key} is written in the file; secrets belong in the "
                f'environment: replace it with {key}_env = "{var}" and `export {var}=...` where the daemon runs'
            )
    return warnings


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else [value]
