"""The mirror's manifests as adoption candidates: each read and checked (untrusted input), the
jobs `--job`/`--all` ask for chosen among them, and the refusals an adoption can end in."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from ..model.errors import OrchError, UsageError
from ..objectstore import manifest as mf
from ..objectstore import signing
from ..contract import is_job_uid
from ..objectstore.manifest_model import MAX_MANIFEST_BYTES, ManifestError
from ..objectstore.manifest_model import parse as parse_manifest
from ..objectstore.remote import Remote, TooLarge

ADOPTABLE = ("queued", "running", "stopped")


class Refused(OrchError):
    """This job is not adopted (its lease is held, it is already here...)."""


class Held(Refused):
    """Its owner's lease is fresh: another machine holds it (`holder_home`); adopting it may only
    wait (a planned move's hand-over: pending.py, or `orch adopt --wait`)."""

    def __init__(self, message: str, uid: str, holder_home: str):
        super().__init__(message)
        self.uid, self.holder_home = uid, holder_home


class Rejected(Refused):
    """Its manifest is not one orch will act on: exit 2 when nothing was adopted."""

    exit_code = 2


class Untrusted(Rejected):
    """Its manifest's signature does not verify under the bucket key: an `untrusted` event, once per
    job and content (`key`)."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


@dataclass
class Candidate:
    uid: str
    manifest: Optional[dict[str, Any]]  # checked (manifest_model); None when `problem` says why not
    etag: Optional[str]
    problem: str = ""
    untrusted: str = ""  # why its signature does not verify (with a bucket key only)
    content: str = ""  # signing.content_id of the manifest's bytes

    @property
    def label(self) -> str:
        name = (self.manifest or {}).get("name")
        return f"job {self.uid[:12]}" + (f" ({name})" if name else "")


def read_candidate(remote: Remote, uid: str, keys: Optional[signing.Keys] = None) -> Optional[Candidate]:
    """One job's manifest, checked (and its signature, with `keys`); None when none was ever committed."""
    if not is_job_uid(uid):
        return Candidate(uid, None, None, f"job {uid[:40]!r}: not a job folder orch writes (its name); skipped")
    key = mf.manifest_key(uid)
    try:
        got = remote.get_with_etag(key, max_bytes=MAX_MANIFEST_BYTES)
    except TooLarge as exc:
        return Candidate(
            uid, None, None, f"job {uid[:12]}: its manifest is over the {MAX_MANIFEST_BYTES >> 20} MB limit: {exc}"
        )
    if got is None:
        return None
    try:
        cand = Candidate(uid, parse_manifest(got[0], remote.where(key), uid), got[1])
    except ManifestError as exc:
        return Candidate(uid, None, got[1], str(exc))
    if keys is not None:
        cand.untrusted = signing.problem(json.loads(got[0].decode("utf-8")), keys) or ""
        cand.content = signing.content_id(got[0])
    return cand


def choose(remote: Remote, wanted: list[str], take_all: bool, keys: Optional[signing.Keys] = None) -> list[Candidate]:
    """The jobs asked for. `--job` by id or id prefix reads only those manifests; a name is looked
    up in every readable manifest."""
    uids: list[str] = sorted(remote.list_dirs("jobs"))
    if take_all:
        every = [c for c in (read_candidate(remote, u, keys) for u in uids) if c is not None]
        return [c for c in every if c.manifest is None or c.manifest.get("state") in ADOPTABLE]
    chosen: list[Candidate] = []
    by_name: Optional[list[Candidate]] = None
    for w in wanted:
        hits = [u for u in uids if u == w or (len(w) >= 4 and u.startswith(w))]
        if len(hits) > 1:
            raise UsageError(
                f"--job {w}: matches {len(hits)} jobs ({', '.join(u[:12] for u in hits)}); give more of the id"
            )
        if hits:
            cand = read_candidate(remote, hits[0], keys)
            if cand is None:
                raise UsageError(f"--job {w}: its manifest was never written (nothing was committed to the mirror)")
            chosen.append(cand)
            continue
        if by_name is None:
            by_name = [c for c in (read_candidate(remote, u, keys) for u in uids) if c is not None and c.manifest]
        named = [c for c in by_name if c.manifest and c.manifest.get("name") == w]
        if not named:
            raise UsageError(f"--job {w}: no such job in the mirror (give its global id, a prefix of it, or its name)")
        if len(named) > 1:
            raise UsageError(
                f"--job {w}: {len(named)} jobs have that name ({', '.join(c.uid[:12] for c in named)}); give the id"
            )
        chosen.append(named[0])
    return chosen
