"""[storage] url: parsing and the credential check. Pure standard library: config.py validates
URLs with it, and a bad URL or a missing credential is a config error naming the key (exit 2)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

SCHEMES = ("s3", "gs", "az", "file")


@dataclass(frozen=True)
class StorageURL:
    scheme: str  # s3 | gs | az | file
    bucket: str  # bucket (s3, gs), "account/container" (az), "" (file)
    prefix: str  # key prefix inside the bucket, no leading or trailing "/"; for file: the folder
    raw: str

    @property
    def base(self) -> str:
        """The URL without the prefix (what obstore's from_url is given with the prefix apart)."""
        if self.scheme == "file":
            return "file://" + self.prefix
        return f"{self.scheme}://{self.bucket}"


def parse_storage_url(url: str) -> StorageURL:
    """`s3://bucket/prefix`, `gs://bucket/prefix`, `az://account/container/prefix` or
    `file:///absolute/folder`. Raises ValueError saying what is wrong."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(
            f"must be s3://bucket/prefix, gs://bucket/prefix, az://account/container/prefix or "
            f"file:///absolute/folder (got {url!r})"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(
            f"unknown scheme {parts.scheme!r} in {url!r}: use one of {', '.join(s + '://' for s in SCHEMES)}"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: no ?query or #fragment allowed")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(
                f"{url!r}: a file URL has three slashes and an absolute path, e.g. file:///root/autodl-fs/orch"
            )
        path = os.path.normpath(parts.path or "/")
        if not path.startswith("/") or path == "/":
            raise ValueError(f"{url!r}: give an absolute folder other than /, e.g. file:///root/autodl-fs/orch")
        return StorageURL("file", "", path, url)
    if not parts.netloc:
        raise ValueError(f"{url!r}: no bucket name")
    bucket = parts.netloc
    segments = [s for s in parts.path.split("/") if s]
    if scheme == "az":
        if not segments:
            raise ValueError(f"{url!r}: an Azure URL is az://account/container[/prefix]")
        bucket = f"{bucket}/{segments.pop(0)}"
    if scheme == "s3" and not (3 <= len(bucket) <= 63):
        raise ValueError(f"{url!r}: an S3 bucket name has 3 to 63 characters")
    if any(s in (".", "..") for s in segments):
        raise ValueError(f"{url!r}: '.' and '..' are not allowed in the prefix")
    return StorageURL(scheme, bucket, "/".join(segments), url)


# Variables that give credentials, per scheme (any one group complete is enough).
_CREDENTIALS: dict[str, list[tuple[str, ...]]] = {
    "s3": [
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"),
        ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",),
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),
    ],
    "gs": [
        ("GOOGLE_SERVICE_ACCOUNT",),
        ("GOOGLE_SERVICE_ACCOUNT_PATH",),
        ("GOOGLE_SERVICE_ACCOUNT_KEY",),
        ("GOOGLE_APPLICATION_CREDENTIALS",),
    ],
    "az": [
        ("AZURE_STORAGE_ACCOUNT_KEY",),
        ("AZURE_STORAGE_ACCESS_KEY",),
        ("AZURE_STORAGE_SAS_KEY",),
        ("AZURE_STORAGE_SAS_TOKEN",),
        ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID"),
    ],
}


def credential_problems(storage: Any, env: Mapping[str, str]) -> list[str]:
    """What is missing for [storage] to reach its store, one line per problem, naming the key.
    Only the names of variables are ever mentioned, never a value."""
    if not storage.url:
        return []
    try:
        url = parse_storage_url(storage.url)
    except ValueError as exc:
        return [f"storage.url: {exc}"]
    if url.scheme == "file" or storage.credentials == "instance":
        return []
    groups = _CREDENTIALS[url.scheme]
    if any(all(env.get(name) for name in group) for group in groups):
        return []
    wanted = " and ".join(groups[0])
    return [
        f"storage.url: {url.scheme}:// needs credentials in the environment ({wanted}; other ways: "
        f'{"; ".join(" + ".join(g) for g in groups[1:])}), or storage.credentials = "instance" on a '
        "machine with an instance role; they are never read from config.toml"
    ]
