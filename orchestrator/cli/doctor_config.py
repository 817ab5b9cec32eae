"""`orch doctor`'s checks of config.toml (as `orch config check`) and of the notifiers' endpoints
(DNS and a TCP connect; nothing is sent)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from ..model.executor_kinds import executor_kind
from .doctor_findings import BAD, OK, Finding

# -- config and notifiers ----------------------------------------------------------------------------


def check_config(path: Path, required: bool, out: list[Finding]) -> Any:
    from ..jobs.notify import load_config_checked
    from ..spec.config import load_config
    from ..model.errors import ConfigError

    if not path.exists() and not required:
        out.append(Finding("config", OK, f"no {path}: the defaults apply"))
        return load_config(None)
    try:
        config = load_config_checked(path, required=True)
    except ConfigError as exc:
        first = exc.problems[0] if exc.problems else str(exc)
        more = f" (+{len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        out.append(Finding("config", BAD, first + more, f"orch config check {path}"))
        return None
    out.append(Finding("config", OK, f"{path} is valid"))
    if executor_kind(config.executor.kind).on_this_machine:  # a cluster's GPUs are not this login node's
        from ..host.gpus import absent_gpus_problem, discover

        gpus = absent_gpus_problem(config.daemon.gpus, discover())
        if gpus:
            out.append(Finding("gpus", BAD, gpus, f'gpus = "auto" in the [daemon] table of {path}'))
    return config


def endpoint(raw: dict[str, Any]) -> Optional[tuple[str, int]]:
    """Host and port a notifier talks to, from its URL or SMTP host, without building it."""
    for key in ("url", "webhook", "webhook_url", "endpoint", "server"):
        value = raw.get(key)
        if isinstance(value, str) and "://" in value:
            parts = urlsplit(value)
            if parts.hostname:
                try:
                    port = parts.port
                except ValueError:
                    port = None
                return parts.hostname, port or (443 if parts.scheme == "https" else 80)
    for key in ("smtp_host", "host"):
        value = raw.get(key)
        if isinstance(value, str) and value:
            port = raw.get("smtp_port") or raw.get("port") or 587
            return value, int(port) if isinstance(port, int) else 587
    return None


def check_notifiers(config: Any, out: list[Finding], timeout: float = 3.0) -> None:
    if not config.notifiers:
        out.append(Finding("notifiers", OK, "none configured"))
        return
    for raw in config.notifiers:
        name = str(raw.get("name") or raw.get("type") or "?")
        target = endpoint(raw)
        if target is None:
            out.append(Finding("notifiers", OK, f"{name}: no network endpoint to check"))
            continue
        host, port = target
        try:
            addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4]
        except (socket.gaierror, UnicodeError) as exc:
            out.append(
                Finding(
                    "notifiers",
                    BAD,
                    f"{name}: cannot resolve {host}: {exc}",
                    f"getent hosts {host}  # check DNS, or the URL in config.toml",
                )
            )
            continue
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as exc:
            out.append(
                Finding(
                    "notifiers",
                    BAD,
                    f"{name}: {host}:{port} ({addr[0]}) does not accept connections: {exc}",
                    f"orch notify test --channel {name}  # after fixing the network or the URL",
                )
            )
            continue
        out.append(Finding("notifiers", OK, f"{name}: {host}:{port} reachable (nothing sent)"))
