"""The keys of a data file's first row, read cheaply (first line of JSON Lines, CSV header) so
`orch submit` can name a missing field before the job runs, and whether the file is empty.
Standard library only (the runner asks the same through jobspec)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Optional, Sequence

_MAX_LINE = 1 << 20  # a first row longer than 1 MiB is not peeked at


def empty_problem(path: Path) -> Optional[str]:
    """Why a data file holds no rows at all (0 bytes, or nothing but blank lines), or None. Read only
    up to its first other byte; not a file (a folder, a hub id): None, its loader decides."""
    try:
        if not path.is_file():
            return None
        if path.stat().st_size == 0:
            return "is empty (0 bytes): there is nothing to train on"
        if path.suffix.lower() not in (".jsonl", ".json", ".csv"):
            return None
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 16):
                if chunk.strip():
                    return None
    except OSError:
        return None
    return "has only blank lines: there is nothing to train on"


_OTHER_SEPARATORS = {";": "';'", "\t": "tab", "|": "'|'"}


def separator_hint(keys: Sequence[str]) -> str:
    """ " — it looks ';'-separated ..." when a CSV header read with commas is one column holding
    another separator (Excel in many locales saves CSV with ';'); "" otherwise. Said after the
    "has no 'text' (it has: text;label)" a reader would otherwise puzzle over."""
    if len(keys) != 1:
        return ""
    for sep, name in _OTHER_SEPARATORS.items():
        if sep in keys[0]:
            return (
                f"; it looks {name}-separated: orch reads CSV with ',' between fields "
                "(save it as comma-separated CSV, or as JSON Lines" + (", or name it .tsv)" if sep == "\t" else ")")
            )
    return ""


def first_keys(path: Path) -> Optional[list[str]]:
    """The first row's keys in file order, or None when the file is not one this can peek into
    cheaply (parquet, a folder, a hub id, a JSON document that is not one object per line)."""
    suffix = path.suffix.lower()
    if not path.is_file():
        return None
    try:
        if suffix in (".jsonl", ".json"):
            return _json_keys(path)
        if suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as fh:
                header = next(csv.reader(fh), None)
            return [h for h in header] if header else None
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


def _json_keys(path: Path) -> Optional[list[str]]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if len(line) > _MAX_LINE:
                return None
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                return None  # a JSON array or an object spread over lines: the loader decides
            return list(row) if isinstance(row, dict) else None
    return None
