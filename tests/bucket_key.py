"""The bucket key the mirror and recovery tests sign with ([storage] signing_key_env): the harnesses
(storage_home, controller_home) and tests/mirror's conftest put it in the environment (the daemons
and `orch watch` they start inherit it), the config files they write name it, and a manifest a test
writes by hand is signed with `signed`, as a machine holding the key would write it. Imported as
`tests.bucket_key` by the harnesses (a benchmark imports them by that full name)."""

from __future__ import annotations

import os
from typing import Any

from orchestrator.objectstore import signing
from orchestrator.spec.config import StorageSection

KEY_ENV = "ORCH_TEST_BUCKET_KEY"
KEY = "orch-test-bucket-key-0123456789abcdef"
KEYS = signing.keys_from(StorageSection(signing_key_env=KEY_ENV), {KEY_ENV: KEY})


def signed(manifest: dict[str, Any]) -> dict[str, Any]:
    return signing.sign(manifest, KEYS)


def put_in_environment() -> None:
    """The key where the daemons and `orch watch` a harness starts find it (they inherit this
    process's environment): a benchmark using the harnesses runs outside pytest's fixtures."""
    os.environ.setdefault(KEY_ENV, KEY)
