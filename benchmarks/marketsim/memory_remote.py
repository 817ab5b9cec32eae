"""An in-memory bucket with the methods of objectstore.remote.Remote that the controller, the claims
and the move requests use: conditional writes with ETags, listing, reads. One per replayed job."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Optional

from orchestrator.objectstore.remote import Conflict, TooLarge


@dataclass(frozen=True)
class _Url:
    raw: str


class MemoryRemote:
    def __init__(self, url: str = "s3://market-benchmark/orch"):
        self.url = _Url(url)
        self.objects: dict[str, tuple[bytes, str]] = {}
        self._etags = itertools.count(1)

    def where(self, key: str) -> str:
        return f"{self.url.raw.rstrip('/')}/{key}"

    def get_with_etag(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, Optional[str]]]:
        got = self.objects.get(key)
        if got is None:
            return None
        if max_bytes is not None and len(got[0]) > max_bytes:
            raise TooLarge(f"{self.where(key)} is {len(got[0])} bytes, more than the {max_bytes} allowed")
        return got

    def get_bytes(self, key: str) -> Optional[bytes]:
        got = self.objects.get(key)
        return None if got is None else got[0]

    def put_bytes(self, key: str, data: bytes) -> Any:
        self.objects[key] = (bytes(data), f"e{next(self._etags)}")

    def cas_put(self, key: str, data: bytes, etag: Optional[str]) -> str:
        held = self.objects.get(key)
        if (held is None) != (etag is None) or (held is not None and held[1] != etag):
            raise Conflict(f"{self.where(key)} changed (or exists already)")
        new = f"e{next(self._etags)}"
        self.objects[key] = (bytes(data), new)
        return new

    def exists(self, key: str) -> bool:
        return key in self.objects

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def list(self, prefix: str) -> list[dict[str, Any]]:
        return [
            {"path": k, "size": len(v[0]), "e_tag": v[1]}
            for k, v in sorted(self.objects.items())
            if k.startswith(prefix)
        ]

    def list_dirs(self, prefix: str) -> list[str]:
        base = prefix.rstrip("/") + "/" if prefix else ""
        return sorted(
            {k[len(base) :].split("/", 1)[0] for k in self.objects if k.startswith(base) and "/" in k[len(base) :]}
        )
