"""`orch doctor` on Ray (model/executor_kinds.py names the check): Ray's Jobs API has no
authentication of its own, so whoever reaches the dashboard runs code on the cluster and reads
every job's runtime_env. Plain HTTP to a public address is that door open: a warning."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from ...home.paths import Home

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


def address_check(
    config: Any, home: Home, resolve: Callable[[str], list[str]] = _addresses
) -> Optional[tuple[str, str, str]]:
    """A warning when [ray] address is plain http:// to a public address; None otherwise."""
    address = config.ray.address
    public = exposed_address(address, resolve)
    if public is None:
        return None
    return (
        "warn",
        f"[ray] address {address} is plain http:// to a public address ({public}): Ray's dashboard has no "
        "login, so anyone who reaches it can run code on the cluster and read its jobs",
        "keep the dashboard port inside the cluster's network (bind it to a private address, firewall it, "
        "or put it behind the platform's auth with https://) and point [ray] address there (docs/ray.md#security)",
    )
