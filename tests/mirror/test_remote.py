"""The storage client wrapper against the loopback S3 server and file://: atomic puts, content
reads, conditional writes (create / update-if-match), listing, deletes, and config errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.objectstore.remote import Conflict, StorageError, sha256_file
from orchestrator.spec.storage_url import credential_problems, parse_storage_url


def test_put_get_list_delete(remote, tmp_path: Path):
    src = tmp_path / "ckpt.bin"
    src.write_bytes(os.urandom(6 * 1024 * 1024 + 17))  # above one 5 MiB part: multipart on S3
    remote.part_size = 5 * 1024 * 1024
    remote.put_file("jobs/u1/checkpoints/a-step-00000001.ckpt", src)
    sha, size = remote.download("jobs/u1/checkpoints/a-step-00000001.ckpt", tmp_path / "back.bin")
    assert (sha, size) == sha256_file(src)
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    remote.put_bytes("jobs/u1/files/progress.json", b"{}")
    remote.put_bytes("jobs/u2/files/progress.json", b"{}")
    assert sorted(remote.list_dirs("jobs")) == ["u1", "u2"]
    assert {m["path"] for m in remote.list("jobs/u1")} == {
        "jobs/u1/checkpoints/a-step-00000001.ckpt",
        "jobs/u1/files/progress.json",
    }
    remote.delete("jobs/u1/checkpoints/a-step-00000001.ckpt")
    remote.delete("jobs/u1/checkpoints/a-step-00000001.ckpt")  # twice is fine
    assert remote.get_bytes("jobs/u1/checkpoints/a-step-00000001.ckpt") is None
    with pytest.raises(FileNotFoundError):
        remote.download("jobs/u1/nothing", tmp_path / "x")


@pytest.mark.parametrize("size", [0, 1000, 5 * 1024 * 1024, 11 * 1024 * 1024 + 3])  # one request .. three parts
def test_a_hashed_upload_returns_the_sha256_and_size_of_exactly_the_bytes_stored(remote, tmp_path: Path, size):
    import asyncio

    src = tmp_path / "ckpt.bin"
    src.write_bytes(os.urandom(size))
    remote.part_size = 5 * 1024 * 1024
    key = f"jobs/u1/checkpoints/t-{size}.ckpt"
    got = asyncio.run(remote.put_file_hashed_async(key, src, concurrency=2))
    assert got == sha256_file(src)
    assert remote.download(key, tmp_path / "back.bin") == got
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_a_hashed_upload_of_a_file_renamed_over_midway_sends_and_hashes_the_file_it_opened(remote, tmp_path: Path):
    """A job may replace a checkpoint under the same name while it uploads: the object and its
    sha256 are both the file that was opened (one read), never a mix or a mismatch."""
    import asyncio

    src, newer = tmp_path / "ckpt.bin", tmp_path / "newer.bin"
    src.write_bytes(os.urandom(11 * 1024 * 1024))
    newer.write_bytes(os.urandom(11 * 1024 * 1024))
    first = sha256_file(src)
    remote.part_size = 5 * 1024 * 1024

    async def upload() -> tuple[str, int]:
        async def swap() -> None:  # runs at the upload's first await: after the open, before most reads
            os.replace(newer, src)  # the path now names other bytes; the open file is unchanged

        task = asyncio.ensure_future(swap())
        result = await remote.put_file_hashed_async("jobs/u1/checkpoints/swap.ckpt", src)
        await task
        return result

    got = asyncio.run(upload())
    assert got == first and sha256_file(src) != first
    assert remote.download("jobs/u1/checkpoints/swap.ckpt", tmp_path / "back.bin") == first


def test_conditional_writes(remote):
    etag = remote.cas_put("jobs/u/manifest.json", b"v1", None)
    with pytest.raises(Conflict):
        remote.cas_put("jobs/u/manifest.json", b"v1b", None)  # create: exists already
    etag2 = remote.cas_put("jobs/u/manifest.json", b"v2", etag)
    assert etag2 != etag
    with pytest.raises(Conflict):
        remote.cas_put("jobs/u/manifest.json", b"stale", etag)  # update with an old ETag
    assert remote.get_bytes("jobs/u/manifest.json") == b"v2"


def test_unreachable_store_is_a_storage_error(storage_section, s3_env):
    from orchestrator.objectstore.remote import Remote

    r = Remote(storage_section("s3://orch-nowhere/p", endpoint="http://127.0.0.1:9"))
    with pytest.raises(StorageError) as err:
        r.put_bytes("x", b"1")
    assert "orch-test-secret" not in str(err.value)


@pytest.mark.parametrize(
    "url, problem",
    [
        ("bucket/prefix", "must be s3://"),
        ("ftp://host/x", "unknown scheme"),
        ("file://relative/x", "three slashes"),
        ("s3://ab/x", "3 to 63"),
        ("az://account", "az://account/container"),
    ],
)
def test_bad_urls(url, problem):
    with pytest.raises(ValueError, match=problem):
        parse_storage_url(url)


def test_good_urls():
    assert parse_storage_url("s3://bkt/a/b/").prefix == "a/b"
    assert parse_storage_url("az://acct/cont/p").bucket == "acct/cont"
    assert parse_storage_url("file:///root/autodl-fs/orch").prefix == "/root/autodl-fs/orch"


def test_missing_credentials_name_the_key(storage_section):
    s = storage_section("s3://bucket-x/p")
    problems = credential_problems(s, {})
    assert problems and problems[0].startswith("storage.url:") and "AWS_ACCESS_KEY_ID" in problems[0]
    assert credential_problems(s, {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}) == []
    assert credential_problems(storage_section("s3://bucket-x/p", credentials="instance"), {}) == []
    assert credential_problems(storage_section("file:///tmp/x"), {}) == []


def test_config_errors_exit_2(tmp_path: Path, orch):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[storage]\nurl = "bucket/prefix"\n')
    ran = orch("--config", cfg, "config", "check")
    assert ran.rc == 2 and "storage.url" in ran.err and "Traceback" not in ran.err, ran
    cfg.write_text('[storage]\nurl = "s3://bucket-x/p"\n')
    ran = orch("--config", cfg, "config", "check", env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""})
    assert ran.rc == 2 and "storage.url" in ran.err and "AWS_ACCESS_KEY_ID" in ran.err, ran


def test_storage_check_against_the_loopback_server(s3_server, s3_env, tmp_path: Path, orch):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[storage]\nurl = "s3://{s3_server.bucket()}/orch"\nendpoint = "{s3_server.endpoint}"\n')
    ran = orch("--config", cfg, "storage", "check", "--mb", "6", env=s3_env)
    assert ran.rc == 0, ran
    for line in (
        "conditional create: ok",
        "read back: ok",
        "conditional update: ok",
        "upload of 6 MB",
        "delete: ok",
        "aborts incomplete multipart uploads",
    ):
        assert line in ran.out, ran.out
    assert "orch-test-secret" not in ran.out + ran.err
    missing = orch("--config", cfg, "storage", "check", "s3://orch-no-such-bucket/p", env=s3_env)
    assert missing.rc == 1 and "FAILED" in missing.out and "Traceback" not in missing.err, missing


def test_without_conditional_writes_a_compare_then_write_still_refuses_a_stale_etag(remote):
    remote.conditional = False  # what a store without If-Match (Aliyun OSS) falls back to
    etag = remote.cas_put("jobs/v/manifest.json", b"v1", None)
    with pytest.raises(Conflict):
        remote.cas_put("jobs/v/manifest.json", b"x", None)
    etag2 = remote.cas_put("jobs/v/manifest.json", b"v2", etag)
    with pytest.raises(Conflict):
        remote.cas_put("jobs/v/manifest.json", b"stale", etag)
    assert remote.get_bytes("jobs/v/manifest.json") == b"v2" and etag2
