"""config.toml's [storage] table: the mirror `orch adopt` resumes from, and the variables naming
the bucket key its manifests are signed with (docs/config-toml.md#storage). Its own module so
config.py stays one page."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, ValidationInfo, field_validator

from .problems import TomlTable
from .storage_url import parse_storage_url


class StorageSection(TomlTable):
    """[storage]: mirror every job to object storage or a network disk so `orch adopt` can resume it
    on another machine (docs/mirror.md). Credentials come only from
    the environment or the instance role, never from this file."""

    url: Optional[str] = None  # s3://bucket/prefix, gs://bucket/prefix, az://account/container/prefix, file:///path
    endpoint: Optional[str] = None  # S3-compatible services (Aliyun OSS, Tencent COS, MinIO): https://host[:port]
    region: Optional[str] = None  # S3 region (else AWS_REGION / AWS_DEFAULT_REGION, else us-east-1)
    virtual_hosted_style: bool = False  # bucket.endpoint/key requests (Aliyun OSS requires them)
    credentials: Literal["env", "instance"] = "env"  # "instance": the machine's role (EC2, GCE), no variables
    keep: int = Field(default=3, ge=1)  # remote checkpoints kept per job (the newest; notice ones count)
    part_size_mb: int = Field(default=16, ge=5, le=5120)  # multipart upload part size
    concurrency: int = Field(default=4, ge=1, le=64)  # parts in flight for a background upload
    notice_concurrency: int = Field(default=16, ge=1, le=128)  # parts in flight for the notice checkpoint
    notice_deadline_seconds: float = Field(default=105.0, gt=0)  # a stopping daemon waits this long for uploads
    stale_after_minutes: float = Field(default=10.0, gt=0)  # `orch adopt` refuses a job whose owner is fresher
    heartbeat_seconds: float = Field(default=60.0, gt=0)  # how often the owner renews its lease
    throttle_seconds: float = Field(default=30.0, ge=0)  # progress, metrics and logs at most this often
    data_max_mb: float = Field(default=2048.0, ge=0)  # local data files up to this size travel with the job
    # The environment variable holding the bucket key: manifests are signed with it, and `orch watch`
    # and `orch adopt` act only on manifests that verify (objectstore/signing.py). Never the key itself.
    signing_key_env: Optional[str] = None
    signing_previous_key_env: Optional[str] = None  # a key being rotated out: still accepted, never signs

    @field_validator("signing_key_env", "signing_previous_key_env")
    @classmethod
    def _env_name(cls, v: Optional[str]) -> Optional[str]:

        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(
                f"must name an environment variable, e.g. ORCH_BUCKET_KEY, not hold the key (got {len(v)} characters)"
            )
        return v

    @field_validator("signing_previous_key_env")
    @classmethod
    def _previous_beside_current(cls, v: Optional[str], info: ValidationInfo) -> Optional[str]:
        # alone it would be read by nothing: without signing_key_env no manifest is signed or verified
        if v is not None and "signing_key_env" in info.data:
            current = info.data["signing_key_env"]
            if current is None:
                raise ValueError(
                    "a key being rotated out is accepted only beside signing_key_env, the key that signs: set both"
                )
            if current == v:
                raise ValueError(f"names {v}, as signing_key_env does: the previous key is another variable")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        parse_storage_url(v)  # raises ValueError naming the problem
        return v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError(f"must start with http:// or https:// (got {v!r})")
        return v
