"""The notification channels config.toml names, built (secrets resolved from the environment,
URLs checked): for the daemon's outbox, `orch notify test`, `orch config check` and doctor. The
spec only checks the shape of [[notifiers]]; building a channel is the notifiers' own business."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional

from ..model.errors import ConfigError
from ..spec.config import Config, load_config
from ..objectstore.signing import key_problems
from ..spec.storage_url import credential_problems


def build_channels(config: Config, env: Optional[Mapping[str, str]] = None) -> list[Any]:
    """Construct the configured notifiers (raises ConfigError naming the notifier)."""
    if not config.notifiers:
        return []
    # Only here: httpx and every channel cost `orch submit` ~0.3 s of imports it needs only when
    # config.toml names a notifier (it makes this check, as `config check` and the daemon do).
    from notifiers import build_notifiers

    label = str(config.path or "config.toml")
    return build_notifiers(config.notifiers, label=label, env=os.environ if env is None else env)


def load_config_checked(
    path: Optional[Path], *, required: bool = False, env: Optional[Mapping[str, str]] = None
) -> Config:
    """config.toml with every secret it names checked too: each channel built and the [storage]
    credentials present, all problems in one report."""
    config = load_config(path, required=required)
    if config.path is None or not config.path.exists():
        return config
    env = os.environ if env is None else env
    problems: list[str] = []
    try:
        build_channels(config, env=env)
    except ConfigError as exc:
        problems += exc.problems
    if config.storage.url:  # [storage] credentials are checked where secrets are
        problems += [f"{config.path}: {p}" for p in credential_problems(config.storage, env)]
        problems += [f"{config.path}: {p}" for p in key_problems(config.storage, env)]
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return config
