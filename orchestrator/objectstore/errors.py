"""What a store call can raise, and the one-line, credential-free text of a store's error."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..model.errors import OrchError
from ..redaction import redact


class TooLarge(OrchError, ValueError):
    """An object bigger than its reader allows (a manifest): refused unread."""


class StorageError(OrchError):
    """The store could not be reached or refused a request (`retryable` unless the request
    itself is wrong: a bad url, a missing bucket, refused credentials)."""

    def __init__(self, message: str, *, retryable: bool = True):
        self.retryable = retryable
        super().__init__(message)


class Conflict(StorageError):
    """A conditional write lost: the object exists already, or changed since it was read."""


def short_error(exc: BaseException) -> str:
    """One line of a store error, with anything that looks like a signature or token masked."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return redact(text)[:300]


def sha256_file(path: Path, chunk: int = 8 * 1024 * 1024) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def is_missing(exc: BaseException) -> bool:
    """The object is not there: a local FileNotFoundError, or obstore's NotFoundError (any store)."""
    return isinstance(exc, FileNotFoundError) or type(exc).__name__ == "NotFoundError"
