"""The one client wrapper for every store orch mirrors to: obstore (pinned in pyproject) gives
one API for s3://, gs://, az:// and file://, atomic puts (a partial object is never visible),
multipart uploads with a set concurrency, and conditional writes. Everything else in orch talks
to storage only through `Remote`, so errors come out as StorageError with a short message that
never holds a credential.

Conditional writes: S3/GCS/Azure use the store's own (If-None-Match / If-Match on the ETag).
obstore's local-file store has no update-if-match, so for file:// the compare and the write
happen under an flock on a lock file beside the objects (one machine, or a network disk whose
locks work across machines, like AutoDL's autodl-fs)."""

from __future__ import annotations

import asyncio
import builtins
import fcntl
import hashlib
import os
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from ..spec.storage_url import StorageURL, parse_storage_url
from ..contract import atomic_file
from .errors import Conflict, StorageError, TooLarge, is_missing, short_error, sha256_file
from .stall import MIN_REQUEST_S, MIN_UPLOAD_BYTES_PER_S, READ_TIMEOUT_S, RETRY_WINDOW_S

__all__ = ["LOCKS", "Conflict", "Remote", "StorageError", "TooLarge", "sha256_file"]

LOCKS = ".orch-locks"  # file:// only: lock files for conditional writes (never listed as objects)


class Remote:
    """A store at [storage] url. Keys are relative to the URL's prefix."""

    def __init__(self, storage: Any, env: Optional[Mapping[str, str]] = None):
        self.settings = storage
        self.url: StorageURL = parse_storage_url(storage.url)
        self.part_size = int(storage.part_size_mb) * 1024 * 1024
        self.concurrency = int(storage.concurrency)
        self.conditional = True  # False once the store turned out to have no conditional writes
        env = os.environ if env is None else env
        self.store = self._build(storage, env, read_timeout=True)
        # Uploads get a client of their own without the read timeout: while a request body goes out
        # nothing is read, and a slow link's upload would be cut at READ_TIMEOUT_S. A stalled upload
        # is caught by probing the store with `self.store` (probe(), daemon/mirror/stall.py).
        self.uploads = self.store if self.url.scheme == "file" else self._build(storage, env, read_timeout=False)

    def __repr__(self) -> str:
        return f"Remote({self.url.raw})"

    def _build(self, storage: Any, env: Mapping[str, str], *, read_timeout: bool) -> Any:
        from obstore.store import from_url

        client: dict[str, Any] = {
            "connect_timeout": timedelta(seconds=5),
            "timeout": timedelta(seconds=max(MIN_REQUEST_S, self.part_size / MIN_UPLOAD_BYTES_PER_S)),
        }
        if read_timeout:
            client["read_timeout"] = timedelta(seconds=READ_TIMEOUT_S)
        retry: dict[str, Any] = {
            "max_retries": 2,
            "retry_timeout": timedelta(seconds=RETRY_WINDOW_S),
            "backoff": {"init_backoff": timedelta(milliseconds=200), "max_backoff": timedelta(seconds=5), "base": 2},
        }
        if self.url.scheme == "file":
            Path(self.url.prefix).mkdir(parents=True, exist_ok=True)
            return from_url("file://" + self.url.prefix, mkdir=True)
        kwargs: dict[str, Any] = {}
        if self.url.scheme == "s3":
            if storage.endpoint:
                kwargs["endpoint"] = storage.endpoint.rstrip("/")
                if storage.endpoint.startswith("http://"):
                    client["allow_http"] = True
            region = storage.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
            kwargs["region"] = region or "us-east-1"
            if storage.virtual_hosted_style:
                kwargs["virtual_hosted_style_request"] = True
        elif storage.endpoint and storage.endpoint.startswith("http://"):
            client["allow_http"] = True
        try:
            return from_url(self.url.raw, client_options=client, retry_config=retry, **kwargs)  # type: ignore[call-overload]
        except Exception as exc:  # obstore's config errors
            raise StorageError(f"[storage] url {self.url.raw}: {short_error(exc)}", retryable=False) from None

    # -- objects --------------------------------------------------------------------------

    def put_file(self, key: str, path: Path, *, concurrency: Optional[int] = None, create: bool = False) -> Any:
        """Upload a local file (multipart above the part size). `create`: only if the key is new."""
        return asyncio.run(self.put_file_async(key, path, concurrency=concurrency, create=create))

    async def put_file_async(
        self, key: str, path: Path, *, concurrency: Optional[int] = None, create: bool = False
    ) -> Any:
        import obstore

        size = Path(path).stat().st_size
        try:
            if create:
                # A conditional put is one request (no multipart): used for small objects only.
                if size <= self.part_size:
                    return await obstore.put_async(self.uploads, key, Path(path), mode="create")
                if await self.exists_async(key):
                    raise Conflict(f"{self.where(key)} exists already")
            return await obstore.put_async(
                self.uploads,
                key,
                Path(path),
                chunk_size=self.part_size,
                max_concurrency=concurrency or self.concurrency,
                use_multipart=size > self.part_size,
            )
        except StorageError:
            raise
        except Exception as exc:
            raise self._error("upload", key, exc) from None

    async def put_file_hashed_async(
        self, key: str, path: Path, *, concurrency: Optional[int] = None
    ) -> tuple[str, int]:
        """Upload a local file and return the sha256 and size of exactly the bytes sent, from the
        one read of the file the upload makes: each part is hashed as it is handed to the store,
        so the first part is in flight at once instead of after a pass over the whole file.
        FileNotFoundError when the file is gone."""
        import obstore

        h = hashlib.sha256()
        sent = 0
        with open(path, "rb", buffering=0) as f:  # one open file: a rename over the path mid-upload changes nothing
            size = os.fstat(f.fileno()).st_size

            async def parts() -> Any:
                nonlocal sent
                while True:
                    block = f.read(self.part_size)  # hashlib and the read release the GIL: obstore's parts go on
                    if not block:
                        return
                    h.update(block)
                    sent += len(block)
                    yield block

            try:
                if size <= self.part_size:  # one request, as put_file_async makes for a small file
                    data = f.read()
                    h.update(data)
                    sent = len(data)
                    await obstore.put_async(self.uploads, key, data, use_multipart=False)
                else:
                    await obstore.put_async(
                        self.uploads,
                        key,
                        parts(),
                        chunk_size=self.part_size,
                        max_concurrency=concurrency or self.concurrency,
                        use_multipart=True,
                    )
            except Exception as exc:
                raise self._error("upload", key, exc) from None
        return h.hexdigest(), sent

    def put_bytes(self, key: str, data: bytes) -> Any:
        import obstore

        try:
            return obstore.put(self.store, key, data, use_multipart=False)
        except Exception as exc:
            raise self._error("write", key, exc) from None

    def get_bytes(self, key: str) -> Optional[bytes]:
        """The object, or None when there is none."""
        got = self.get_with_etag(key)
        return None if got is None else got[0]

    def get_with_etag(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, Optional[str]]]:
        """The object and its etag, or None when there is none. Above `max_bytes` it is not read:
        TooLarge."""
        import obstore

        try:
            result = obstore.get(self.store, key)
            size = result.meta.get("size")
            if max_bytes is not None and isinstance(size, int) and size > max_bytes:
                raise TooLarge(f"{self.where(key)} is {size} bytes, more than the {max_bytes} allowed; not read")
            return bytes(result.bytes()), result.meta.get("e_tag")
        except TooLarge:
            raise
        except Exception as exc:
            if is_missing(exc):
                return None
            raise self._error("read", key, exc) from None

    def download(self, key: str, dest: Path) -> tuple[str, int]:
        """Stream an object to `dest` (through a temp file, fsynced and renamed into place);
        returns its sha256 and size. Raises StorageError, FileNotFoundError when it is missing."""
        import obstore

        h = hashlib.sha256()
        size = 0
        try:
            result = obstore.get(self.store, key)
            with atomic_file(Path(dest)) as f:
                for chunk in result.stream(min_chunk_size=8 * 1024 * 1024):
                    view = memoryview(chunk)
                    h.update(view)
                    f.write(view)
                    size += len(view)
        except Exception as exc:
            if is_missing(exc):
                raise FileNotFoundError(self.where(key)) from None
            raise self._error("download", key, exc) from None
        return h.hexdigest(), size

    def probe(self) -> None:
        """One small request (a HEAD) through the client with the read timeout: StorageError when
        the store does not answer in READ_TIMEOUT_S, whatever an upload in flight is waiting for."""
        self.exists(f"{LOCKS}/probe")

    def exists(self, key: str) -> bool:
        return asyncio.run(self.exists_async(key))

    async def exists_async(self, key: str) -> bool:
        import obstore

        try:
            await obstore.head_async(self.store, key)
            return True
        except Exception as exc:
            if is_missing(exc):
                return False
            raise self._error("look up", key, exc) from None

    def delete(self, key: str) -> None:
        import obstore

        try:
            obstore.delete(self.store, key)
        except Exception as exc:
            if is_missing(exc):
                return
            raise self._error("delete", key, exc) from None

    def list(self, prefix: str) -> builtins.list[Any]:
        import obstore

        try:
            out = []
            for batch in obstore.list(self.store, prefix=prefix):
                out += [m for m in batch if not m["path"].startswith(LOCKS)]
            return out
        except Exception as exc:
            raise self._error("list", prefix, exc) from None

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        """The 'folders' directly under `prefix` (without it and without a trailing slash)."""
        import obstore

        try:
            found = obstore.list_with_delimiter(self.store, prefix=prefix)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._error("list", prefix, exc) from None
        base = prefix.rstrip("/") + "/" if prefix else ""
        return [p[len(base) :].strip("/") if p.startswith(base) else p.strip("/") for p in found["common_prefixes"]]

    # -- the conditional write the manifest relies on ---------------------------------------

    def cas_put(self, key: str, data: bytes, etag: Optional[str]) -> str:
        """Write `data` only if the object is still the version `etag` names (None: only if there is
        no object yet). Returns the new ETag; raises Conflict when someone else wrote first."""
        import obstore

        if self.url.scheme == "file":
            with self._file_lock(key):
                current = self._local_etag(key)
                if current != etag:
                    raise Conflict(
                        f"{self.where(key)} changed since it was read" if etag else f"{self.where(key)} exists already"
                    )
                try:
                    obstore.put(self.store, key, data, use_multipart=False)
                except Exception as exc:
                    raise self._error("write", key, exc) from None
                new = self._local_etag(key)
                assert new is not None
                return new
        if not self.conditional:
            return self._compare_and_put(key, data, etag)
        mode: Any = "create" if etag is None else {"e_tag": etag}
        try:
            result = obstore.put(self.store, key, data, mode=mode, use_multipart=False)
        except Exception as exc:
            name = type(exc).__name__
            if name in ("AlreadyExistsError", "PreconditionError"):
                raise Conflict(
                    f"{self.where(key)} " + ("exists already" if etag is None else "changed since it was read")
                ) from None
            if (
                name == "NotSupportedError"
                or "not yet implemented" in str(exc)
                or "NotImplemented" in str(exc)
                or " 501" in str(exc)
            ):
                # A store without S3 conditional writes (Aliyun OSS): compare, then write; the owner
                # lease in the manifest is then what keeps two machines apart.
                self.conditional = False
                return self._compare_and_put(key, data, etag)
            raise self._error("write", key, exc) from None
        if result.get("e_tag"):
            return str(result["e_tag"])
        got = self.get_with_etag(key)
        return (got[1] if got else None) or ""

    def _compare_and_put(self, key: str, data: bytes, etag: Optional[str]) -> str:
        import obstore

        if self._local_etag(key) != etag:
            raise Conflict(f"{self.where(key)} " + ("exists already" if etag is None else "changed since it was read"))
        try:
            result = obstore.put(self.store, key, data, use_multipart=False)
        except Exception as exc:
            raise self._error("write", key, exc) from None
        return result.get("e_tag") or self._local_etag(key) or ""

    def _local_etag(self, key: str) -> Optional[str]:
        import obstore

        try:
            return obstore.head(self.store, key).get("e_tag")
        except Exception as exc:
            if is_missing(exc):
                return None
            raise self._error("look up", key, exc) from None

    @contextmanager
    def _file_lock(self, key: str) -> Iterator[None]:
        folder = Path(self.url.prefix) / LOCKS
        folder.mkdir(parents=True, exist_ok=True)
        if folder.is_symlink():  # whoever can write the store must not aim our writes elsewhere
            raise StorageError(f"{folder} is a symbolic link; orch never follows one for its lock files: remove it")
        name = hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock"
        try:
            fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # ELOOP: a link planted where the lock file belongs
            raise StorageError(
                f"cannot open the lock file {folder / name}: {exc.strerror or exc} "
                "(a link there is never followed: remove it)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- messages -----------------------------------------------------------------------------

    def where(self, key: str) -> str:
        base = self.url.raw.rstrip("/")
        return f"{base}/{key}"

    def _error(self, what: str, key: str, exc: BaseException) -> StorageError:
        name = type(exc).__name__
        permanent = name in (
            "PermissionDeniedError",
            "UnauthenticatedError",
            "InvalidPathError",
            "UnknownConfigurationKeyError",
        )
        return StorageError(f"cannot {what} {self.where(key)}: {short_error(exc)}", retryable=not permanent)
