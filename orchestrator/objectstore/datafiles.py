"""The data a built-in job needs travels with it: its local training/validation files and a local
model folder are uploaded once, content-addressed (`<prefix>/data/<sha256>`, so two jobs on the
same file share one object), when their total is at most [storage] data_max_mb. The manifest
lists every file with its sha256 and size either way. On adoption each input is found by
fingerprint: at its old path, or at a path given with `--map OLD=NEW`, or downloaded from the
mirror into $ORCH_HOME/data/; an input that is none of these is named with its size, and the job
is not adopted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from .remote import Remote, sha256_file

ROLES = (("data", "train"), ("data", "validation"), ("model", "name_or_path"))


def data_key(sha256: str) -> str:
    return f"data/{sha256}"


def local_inputs(spec: dict[str, Any]) -> list[tuple[str, Path]]:
    """(role, absolute path) of a built-in job's inputs that exist on this machine (a hub model
    name or a missing path is not a local input)."""
    out = []
    for section, key in ROLES:
        value = (spec.get(section) or {}).get(key)
        if isinstance(value, str) and value and os.path.isabs(value) and os.path.exists(value):
            out.append((f"{section}.{key}", Path(value)))
    return out


def _files(root: Path) -> list[tuple[str, Path]]:
    if root.is_file():
        return [("", root)]
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            found.append((str(path.relative_to(root)), path))
    return sorted(found)


def collect(
    spec: dict[str, Any], max_bytes: int, cache: Optional[dict[tuple[str, float, int], str]] = None
) -> list[dict[str, Any]]:
    """Every input file with its fingerprint; `key` set when they travel (total under the limit)."""
    cache = {} if cache is None else cache
    entries: list[dict[str, Any]] = []
    for role, root in local_inputs(spec):
        for rel, path in _files(root):
            st = path.stat()
            memo = (str(path), st.st_mtime, st.st_size)
            sha = cache.get(memo)
            if sha is None:
                sha, _ = sha256_file(path)
                cache[memo] = sha
            entries.append({"role": role, "root": str(root), "rel": rel, "sha256": sha, "bytes": st.st_size})
    travel = sum(e["bytes"] for e in entries) <= max_bytes
    for e in entries:
        e["key"] = data_key(e["sha256"]) if travel else None
    return entries


def upload(remote: Remote, entries: list[dict[str, Any]]) -> int:
    """Upload the entries that travel and are not in the store yet; returns how many were sent."""
    sent = 0
    for e in entries:
        if e.get("key") and not remote.exists(e["key"]):
            path = Path(e["root"]) / e["rel"] if e["rel"] else Path(e["root"])
            remote.put_file(e["key"], path)
            sent += 1
    return sent


def _mapped(root: str, mapping: list[tuple[str, str]]) -> str:
    for old, new in mapping:
        old_n = old.rstrip("/")
        if root == old_n or root.startswith(old_n + "/"):
            return new.rstrip("/") + root[len(old_n) :]
    return root


def _matches(candidate: Path, files: list[dict[str, Any]]) -> bool:
    for e in files:
        path = candidate / e["rel"] if e["rel"] else candidate
        try:
            if path.stat().st_size != e["bytes"] or sha256_file(path)[0] != e["sha256"]:
                return False
        except OSError:
            return False
    return True


def plan(entries: list[dict[str, Any]], mapping: list[tuple[str, str]]) -> tuple[dict[str, str], list[str], list[str]]:
    """Per role: the local path that has the same bytes (old path or mapped), the roles to download,
    and problems naming each input that can be neither found nor downloaded."""
    roles: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        roles.setdefault(e["role"], []).append(e)
    found, download, problems = {}, [], []
    for role, files in roles.items():
        root = files[0]["root"]
        candidate = _mapped(root, mapping)
        if _matches(Path(candidate), files):
            found[role] = candidate
        elif all(e.get("key") for e in files):
            download.append(role)
        else:
            size = sum(e["bytes"] for e in files) / 1e6
            where = f"{candidate} (mapped from {root})" if candidate != root else root
            problems.append(
                f"{role} = {where}: missing here or not the same bytes ({len(files)} file(s), {size:.0f} MB, "
                f"not mirrored: above [storage] data_max_mb); copy it to that path, or map its folder with "
                f"--map {os.path.dirname(root) or root}=/new/folder"
            )
    return found, download, problems


def fetch(
    remote: Remote, entries: list[dict[str, Any]], role: str, dest_root: Path, warn: Callable[[str], None]
) -> str:
    """Download one role's files into dest_root/<sha of its first file>/...; returns the new path
    (a file for data files, the folder for a model)."""
    files = [e for e in entries if e["role"] == role]
    base = dest_root / files[0]["sha256"][:16]
    single = len(files) == 1 and not files[0]["rel"]
    target_root = base / Path(files[0]["root"]).name if single else base / Path(files[0]["root"]).name
    for e in files:
        dest = target_root if single else target_root / e["rel"]
        inside = dest.resolve(strict=False)
        if not single and target_root.resolve(strict=False) not in inside.parents:
            raise ValueError(f"{role}: {e['rel']!r} does not stay inside {target_root}; refused")
        sha, size = remote.download(e["key"], dest)
        if sha != e["sha256"] or size != e["bytes"]:
            dest.unlink(missing_ok=True)
            raise ValueError(f"{remote.where(e['key'])}: sha256 or size does not match the manifest ({role})")
    return str(target_root)


def rewrite(spec: dict[str, Any], new_paths: dict[str, str]) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in spec.items()}
    for role, path in new_paths.items():
        section, key = role.split(".", 1)
        if isinstance(out.get(section), dict):
            out[section][key] = path
    return out
