"""Checkpoints that are folders (a `transformers.Trainer` checkpoint-N/, linked into
ORCH_CKPT_DIR under a contract name by training/scripts/hf_trainer.py) travel as one tar object:
packed with sorted names and zeroed times and owners, so the same folder always gives the same
bytes (and sha256), and unpacked on adoption with tarfile's "data" filter (no absolute paths,
no links out of the folder, no devices)."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

PACKED_TAR = "tar"  # a manifest record's "packed" value


def pack_folder(folder: Path, dest: Path) -> Path:
    """`folder` (a link to one is followed) as an uncompressed tar at `dest`, written whole or not at all."""
    folder = Path(folder).resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for root, dirs, files in os.walk(folder):
                dirs.sort()
                for name in sorted(files):
                    path = Path(root) / name
                    tar.add(path, arcname=str(path.relative_to(folder)), recursive=False, filter=clean)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def unpack_folder(archive: Path, dest: Path) -> Path:
    """Unpack `archive` into a new folder `dest` (beside it, renamed into place when complete)."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.unpack")
    try:
        with tarfile.open(archive, "r") as tar:
            tar.extractall(tmp, filter="data")
        os.replace(tmp, dest)
    except BaseException:  # a rejected member or a torn tar leaves no half folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
