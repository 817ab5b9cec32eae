"""`orch doctor`'s checks of config.toml (as `orch config check`) and of the notifiers' endpoints
(DNS and a TCP connect; nothing is sent)."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from ..model.executor_kinds import executor_kind
from .doctor_findings import BAD, OK, WARN, Finding

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


# -- the Ray head's address ----------------------------------------------------------------------------

_SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")  # RFC 6598: carrier NAT, Tailscale; never routed


def _addresses(host: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError):
        return []  # cannot tell: the shared-folder probe says the head cannot be reached


def exposed_address(address: str, resolve: Callable[[str], list[str]] = _addresses) -> Optional[str]:
    """The public address a plain-http:// [ray] address reaches, or None (https, loopback, a
    private network, or a name that does not resolve)."""
    parts = urlsplit(address)
    if parts.scheme != "http" or not parts.hostname:
        return None
    try:
        found = [ipaddress.ip_address(parts.hostname)]
    except ValueError:
        found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolve(parts.hostname)]
    for ip in found:
        mapped = getattr(ip, "ipv4_mapped", None) or ip
        if not (mapped.is_loopback or mapped.is_private or mapped.is_link_local or mapped in _SHARED_ADDRESS_SPACE):
            return str(ip)
    return None


def check_ray_address(address: str, out: list[Finding], resolve: Callable[[str], list[str]] = _addresses) -> None:
    """Ray's Jobs API has no authentication of its own: whoever reaches the dashboard runs code on
    the cluster and reads every job's runtime_env. Plain HTTP to a public address is that door open."""
    public = exposed_address(address, resolve)
    if public is None:
        return
    out.append(
        Finding(
            "ray",
            WARN,
            f"[ray] address {address} is plain http:// to a public address ({public}): Ray's dashboard has no "
            "login, so anyone who reaches it can run code on the cluster and read its jobs",
            "keep the dashboard port inside the cluster's network (bind it to a private address, firewall it, "
            "or put it behind the platform's auth with https://) and point [ray] address there (docs/ray.md#security)",
        )
    )
