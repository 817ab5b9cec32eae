"""A real S3-compatible server on loopback for the mirror tests: moto's server (a Werkzeug HTTP
server speaking the S3 REST API, with ETags, multipart uploads and 412 on failed conditional
writes) in a thread of the test process, so it outlives every orch process a test SIGKILLs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from bucket_key import KEY, KEY_ENV
from s3_server import S3Server

ACCESS = {"AWS_ACCESS_KEY_ID": "orch-test-key", "AWS_SECRET_ACCESS_KEY": "orch-test-secret", "AWS_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def bucket_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The bucket key in this process's environment (daemons and `orch watch` started from it
    inherit it); the config files these tests write name it (storage_toml, controller_home)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Test credentials in this process's environment (so daemons started from it inherit them)."""
    for key, value in ACCESS.items():
        monkeypatch.setenv(key, value)
    return dict(ACCESS)


@pytest.fixture
def storage_section() -> Callable[..., Any]:
    from orchestrator.spec.config import StorageSection

    def make(url: str, **kw: Any) -> Any:
        return StorageSection(url=url, **kw)

    return make


@pytest.fixture(params=["s3", "file"])
def remote(request, s3_server, s3_env, tmp_path: Path, storage_section) -> Any:
    """A Remote on a fresh bucket of the loopback S3 server, and one on a file:// folder."""
    from orchestrator.objectstore.remote import Remote

    if request.param == "s3":
        return Remote(storage_section(f"s3://{s3_server.bucket()}/orch", endpoint=s3_server.endpoint))
    return Remote(storage_section(f"file://{tmp_path}/store"))


def storage_toml(url: str, endpoint: str | None = None, **kw: Any) -> str:
    import json

    lines = ["[storage]", f"url = {json.dumps(url)}"]
    if endpoint:
        lines.append(f"endpoint = {json.dumps(endpoint)}")
    kw = {"signing_key_env": KEY_ENV, **kw}  # signed manifests, as a deployment with a key writes them
    lines += [f"{k} = {json.dumps(v)}" for k, v in kw.items() if v is not None]
    return "\n".join(lines) + "\n"


os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def homes() -> Iterator[list[Any]]:
    """OrchHomes a test made (one per machine of the scenario), cleaned up after it."""
    made: list[Any] = []
    yield made
    for h in made:
        h.cleanup()


@pytest.fixture(scope="session")
def workload(tmp_path_factory) -> dict[str, Path]:
    """The tiny BERT and its data (tiny_bert.py), made once per session."""
    from tiny_bert import make_workload

    return make_workload(tmp_path_factory.mktemp("workload"))


@pytest.fixture(scope="session")
def uninterrupted(workload, tmp_path_factory) -> dict[str, Any]:
    """The tiny-BERT job run once without interruption: the weights every lost-machine test must match."""
    from tiny_bert import run_uninterrupted

    return run_uninterrupted(workload, tmp_path_factory.mktemp("run-a") / "a")
