"""Signed manifests: an HMAC-SHA256 over a manifest, under a key the controller and the machines
hold and the bucket never does ([storage] signing_key_env names the environment variable). The
bucket is untrusted (docs/security.md): whoever can write it can write any manifest, so `orch watch`
launches and `orch adopt` adopts only a manifest whose signature verifies. Every writer of a
manifest signs it: `orch launch`, the daemon's mirror (each lease renewal too) and `orch adopt`.

What is signed: every field of the manifest but `signature` itself, as sorted-key JSON without
spaces (the canonical form below) -- the spec, gpus, budget, state, the owner lease and its
heartbeat, `written_at`, all of it, so a change to any field after signing fails. The signature
names the key by an id (a hash of the key, never the key), so keys can rotate: sign with the new
one while the controller and the machines still verify with the old one too
([storage] signing_previous_key_env)."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..model.errors import ConfigError

SIGNATURE = "signature"  # the manifest's field that carries it
ALGORITHM = "hmac-sha256"
MIN_KEY_BYTES = 16  # a shorter key is refused: it could be guessed


@dataclass(frozen=True)
class Keys:
    """The key this process signs with and every key it accepts, by key id. `repr` never shows a key."""

    signing_id: str
    _by_id: dict[str, bytes] = field(repr=False)
    env_name: str = ""

    def key(self, key_id: str) -> Optional[bytes]:
        return self._by_id.get(key_id)


def key_id(key: bytes) -> str:
    """A name for the key that says nothing about it: 16 hex digits of a hash of it."""
    return hashlib.sha256(b"orch bucket key id\0" + key).hexdigest()[:16]


def keys_from(storage: Any, env: Mapping[str, str]) -> Optional[Keys]:
    """The keys [storage] names, read from `env`; None when it names none. Raises ConfigError naming
    the variable (never its value) when one is named but unset or too short."""
    name = getattr(storage, "signing_key_env", None)
    if not name:
        return None
    names = [("storage.signing_key_env", name)]
    previous = getattr(storage, "signing_previous_key_env", None)
    if previous:
        names.append(("storage.signing_previous_key_env", previous))
    problems, by_id, first = [], {}, ""
    for field_name, var in names:
        value = env.get(var) or ""
        if not value:
            problems.append(
                f"{field_name}: names {var}, which is not set in this environment: export the bucket key "
                "there (the controller and every machine need the same one; docs/security.md)"
            )
            continue
        if len(value.encode()) < MIN_KEY_BYTES:
            problems.append(
                f"{field_name}: the key in {var} is shorter than {MIN_KEY_BYTES} bytes; make one with "
                "`python -c 'import secrets; print(secrets.token_hex(32))'`"
            )
            continue
        kid = key_id(value.encode())
        by_id[kid] = value.encode()
        first = first or kid
    if problems:
        raise ConfigError(problems)
    return Keys(first, by_id, name)


def key_problems(storage: Any, env: Mapping[str, str]) -> list[str]:
    """keys_from's refusals as lines (for `orch config check`, doctor and the commands' checks)."""
    try:
        keys_from(storage, env)
    except ConfigError as exc:
        return list(exc.problems)
    return []


def canonical(manifest: Mapping[str, Any]) -> bytes:
    """The bytes the HMAC covers: every field but the signature, sorted-key JSON without spaces.
    The writer's dict goes through JSON first, so what it signs is what a reader parses."""
    body = {k: v for k, v in manifest.items() if k != SIGNATURE}
    plain = json.loads(json.dumps(body, default=str))
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(key: bytes, manifest: Mapping[str, Any]) -> str:
    return hmac.new(key, canonical(manifest), hashlib.sha256).hexdigest()


def sign(manifest: dict[str, Any], keys: Optional[Keys]) -> dict[str, Any]:
    """The manifest with its signature (in place, and returned); unchanged without keys."""
    manifest.pop(SIGNATURE, None)
    if keys is None:
        return manifest
    key = keys.key(keys.signing_id)
    assert key is not None
    manifest[SIGNATURE] = {"alg": ALGORITHM, "key_id": keys.signing_id, "mac": _mac(key, manifest)}
    return manifest


def problem(manifest: Mapping[str, Any], keys: Keys) -> Optional[str]:
    """Why this manifest is not trusted, in words, or None when its signature verifies."""
    sig = manifest.get(SIGNATURE)
    if sig is None:
        return "it is not signed (whoever wrote it did not hold the bucket key)"
    if not isinstance(sig, dict) or not all(isinstance(sig.get(k), str) for k in ("alg", "key_id", "mac")):
        return "it carries a malformed signature"
    if sig["alg"] != ALGORITHM:
        return f"it is signed with {sig['alg'][:20]!r}, not {ALGORITHM}"
    key = keys.key(sig["key_id"])
    if key is None:
        return (
            f"it is signed with a key this machine does not hold (key id {sig['key_id'][:16]!r}; "
            f"ours is {keys.signing_id})"
        )
    if not hmac.compare_digest(_mac(key, manifest), sig["mac"]):
        return "it was changed after signing (the HMAC does not match its content)"
    return None


def content_id(raw: bytes) -> str:
    """A short name for one version of a manifest's bytes (an `untrusted` report is made once per
    job and content)."""
    return hashlib.sha256(raw).hexdigest()[:16]
