"""`orch doctor` on Ray warns when `[ray] address` is plain http:// to a public address: Ray's Jobs
API has no login, so whoever reaches it runs code on the cluster and reads every job's
runtime_env. Loopback, private networks (RFC 1918, unique-local IPv6, carrier-grade NAT such as
Tailscale's), link-local and https:// pass quietly. A name is judged by what it resolves to (the
resolver is the one seam: this machine resolves no public names)."""

from __future__ import annotations

import pytest

from orchestrator.executors.ray.doctor import address_check, exposed_address
from orchestrator.model.executor_kinds import executor_kind
from orchestrator.spec.config import load_config

NAMES = {"ray-head.internal": ["10.1.2.3"], "ray.example.com": ["10.0.0.9", "8.8.4.4"], "nowhere": []}


def resolve(host: str) -> list[str]:
    return NAMES[host]


@pytest.mark.parametrize(
    "address, public",
    [
        ("http://127.0.0.1:8265", None),
        ("http://[::1]:8265", None),
        ("http://10.0.3.7:8265", None),
        ("http://172.20.0.2:8265", None),
        ("http://192.168.1.10:8265", None),
        ("http://100.101.102.103:8265", None),  # carrier-grade NAT / Tailscale
        ("http://[fd12:3456::1]:8265", None),  # unique-local IPv6
        ("http://169.254.10.1:8265", None),
        ("http://ray-head.internal:8265", None),
        ("http://nowhere:8265", None),  # cannot tell: the shared-folder probe reports the head unreachable
        ("https://8.8.8.8:8265", None),  # behind TLS (and, one hopes, the platform's auth)
        ("http://8.8.8.8:8265", "8.8.8.8"),
        ("http://[2001:4860:4860::8888]:8265", "2001:4860:4860::8888"),
        ("http://[::ffff:8.8.8.8]:8265", "::ffff:808:808"),
        ("http://ray.example.com:8265", "8.8.4.4"),  # any public address the name reaches
    ],
)
def test_which_addresses_are_plain_http_to_the_public(address, public):
    assert exposed_address(address, resolve) == public


def ray_config(tmp_path, address):
    path = tmp_path / "config.toml"
    path.write_text(f'[executor]\nkind = "ray"\n\n[ray]\naddress = "{address}"\n')
    return load_config(path)


def test_doctor_warns_with_the_address_and_the_fix(tmp_path):
    level, text, fix = address_check(ray_config(tmp_path, "http://ray.example.com:8265"), None, resolve)
    assert level == "warn"
    assert "plain http:// to a public address (8.8.4.4)" in text and "no login" in text
    assert "bind it to a private address, firewall it, or put it behind the platform's auth" in fix
    assert address_check(ray_config(tmp_path, "http://127.0.0.1:8265"), None, resolve) is None


def test_the_ray_kind_declares_the_address_check():
    """`orch doctor` runs it because the registry says so (model/executor_kinds.py), not because
    the doctor knows Ray."""
    assert "orchestrator.executors.ray.doctor:address_check" in executor_kind("ray").doctor_checks
