"""Download a job's newest usable checkpoint from the mirror: the newest one whose sha256 and size
match its manifest record, unpacked if it is a folder's tar; a missing object, a mismatch or a tar
that does not unpack cleanly is rejected (named, and left behind nowhere) and the next older one
is tried."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path
from typing import Any, Callable, Optional

from .packing import PACKED_TAR, unpack_folder
from .remote import Remote


def fetch_checkpoint(
    remote: Remote, history: list[dict[str, Any]], folder: Path, warn: Callable[[str], None]
) -> tuple[Optional[dict[str, Any]], list[str]]:
    """Download the newest checkpoint of `history` (checked records, newest first) that can be
    used; older ones only if a newer one cannot. Returns (the one used or None, rejected keys)."""
    rejected: list[str] = []
    for record in history:
        packed = record.get("packed") == PACKED_TAR  # a folder checkpoint (objectstore/packing.py)
        dest = folder / (f".{record['name']}.tar" if packed else record["name"])
        try:
            sha, size = remote.download(record["key"], dest)
        except FileNotFoundError:
            warn(f"warning: {remote.where(record['key'])} is missing; falling back to an older checkpoint")
            rejected.append(record["key"])
            continue
        if sha != record["sha256"] or size != record["bytes"]:
            dest.unlink(missing_ok=True)
            warn(
                f"warning: rejected {remote.where(record['key'])}: sha256 {sha[:16]}… size {size} does not match the "
                f"manifest's {record['sha256'][:16]}… size {record['bytes']}; falling back to an older checkpoint"
            )
            rejected.append(record["key"])
            continue
        if packed:
            target = folder / record["name"]
            try:
                unpack_folder(dest, target)
            except (tarfile.TarError, OSError, ValueError, EOFError) as exc:
                shutil.rmtree(target, ignore_errors=True)
                warn(
                    f"warning: rejected {remote.where(record['key'])}: its tar does not unpack safely "
                    f"({type(exc).__name__}: {str(exc)[:120]}); falling back to an older checkpoint"
                )
                rejected.append(record["key"])
                continue
            finally:
                dest.unlink(missing_ok=True)
        return record, rejected
    if history:
        warn("warning: no mirrored checkpoint could be used; the job starts from scratch")
    return None, rejected
