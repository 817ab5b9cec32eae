"""The job uid's one rule (contract.JOB_UID_PATTERN): the manifest's model, `orch adopt`'s
candidate check and the recovery bootstrap all ask is_job_uid, so they agree on every case."""

from __future__ import annotations

import pytest

from orchestrator.contract import is_job_uid
from orchestrator.objectstore.manifest_model import ManifestError, parse


@pytest.mark.parametrize(
    "text, ok",
    [
        ("40e8392545c04a8692e621bb15c7d8e9", True),  # what orch makes (a uuid4's hex; a fixed one, so
        # every pytest-xdist worker collects the same test ids)
        ("a", True),
        ("A-b_9", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("", False),
        ("abc\n", False),  # `$` alone would let a trailing newline through
        ("a/b", False),
        ("..", False),
        ("a b", False),
        ("ä", False),
    ],
)
def test_is_job_uid(text: str, ok: bool) -> None:
    assert is_job_uid(text) is ok


def test_the_manifest_model_uses_the_same_rule() -> None:
    with pytest.raises(ManifestError, match=r"uid: string should match pattern '\^\[0-9A-Za-z_-\]\{1,64\}\$'"):
        parse(b'{"version": 1, "uid": "a/b"}', "jobs/a/manifest.json")
    with pytest.raises(ManifestError) as ok_uid:
        parse(b'{"version": 1, "uid": "a-b"}', "jobs/a/manifest.json")
    assert "uid" not in str(ok_uid.value)
