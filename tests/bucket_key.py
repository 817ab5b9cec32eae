"""The bucket key the mirror and recovery tests sign with ([storage] signing_key_env): tests/mirror's
conftest puts it in the environment (the daemons and `orch watch` they start inherit it), their
config files name it, and a manifest a test writes by hand is signed with `signed`, as a machine
holding the key would write it."""

from __future__ import annotations

from typing import Any

from orchestrator.objectstore import signing
from orchestrator.spec.config import StorageSection

KEY_ENV = "ORCH_TEST_BUCKET_KEY"
KEY = "orch-test-bucket-key-0123456789abcdef"
KEYS = signing.keys_from(StorageSection(signing_key_env=KEY_ENV), {KEY_ENV: KEY})


def signed(manifest: dict[str, Any]) -> dict[str, Any]:
    return signing.sign(manifest, KEYS)
