"""The first rows of a local data file, read cheaply for the pre-flight: at most MAX_ROWS rows or
MAX_BYTES bytes of JSON Lines, a JSON array, CSV or parquet, never the whole of a large file.
Standard library only (pyarrow for parquet)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from training.builtin.rows import unsupported_type

MAX_ROWS = 1000
MAX_BYTES = 8 << 20
WHOLE_JSON_BYTES = 32 << 20  # a .json document (not one object per line) is parsed whole up to this


class SampleError(ValueError):
    """The file cannot be what its loader expects (a line that is not JSON, a row that is not an object)."""


@dataclass
class Sample:
    rows: list[dict[str, Any]]
    complete: bool  # every row of the file is in rows (so a set built from them is the file's)
    csv: bool = False  # values are text as written (the loader infers numbers)


def read_sample(path: Path, max_rows: int = MAX_ROWS) -> Optional[Sample]:
    """The first rows of `path`, or None for a file this cannot peek into (the runner reads it).
    A type the runner cannot read either (.xlsx, .txt) raises SampleError."""
    suffix = path.suffix.lower()
    unsupported = unsupported_type(suffix)
    if unsupported:
        raise SampleError(unsupported)
    if suffix in (".jsonl", ".json"):
        return _json_rows(path, max_rows)
    if suffix in (".csv", ".tsv"):
        return _csv_rows(path, max_rows, "\t" if suffix == ".tsv" else ",")
    if suffix in (".parquet", ".pq"):
        return _parquet_rows(path, max_rows)
    return None


def _json_rows(path: Path, max_rows: int) -> Optional[Sample]:
    rows: list[dict[str, Any]] = []
    read = 0
    with open(path, encoding="utf-8", errors="strict") as fh:
        for number, line in enumerate(fh, 1):
            read += len(line)
            text = line.strip()
            if not text:
                continue
            if not rows and text.startswith("["):
                return _json_document(path, max_rows)
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                if not rows and path.suffix.lower() == ".json":
                    return _json_document(path, max_rows)  # one object spread over lines
                raise SampleError(f"line {number} is not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise SampleError(f"line {number} is a JSON {type(row).__name__}, not an object with fields")
            rows.append(row)
            if len(rows) >= max_rows or read >= MAX_BYTES:
                return Sample(rows, complete=_at_end(fh))
    return Sample(rows, complete=True)


def _at_end(fh: io.TextIOBase) -> bool:
    """Nothing but blank lines left in fh (read a little, not the rest of a large file)."""
    rest = fh.read(1 << 16)
    return not rest.strip() and not fh.read(1)


def _json_document(path: Path, max_rows: int) -> Optional[Sample]:
    if path.stat().st_size > WHOLE_JSON_BYTES:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SampleError(f"is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, list):
        return None  # an object of columns, or rows under a key: the loader decides
    for i, row in enumerate(data[:max_rows]):
        if not isinstance(row, dict):
            raise SampleError(f"item {i} is a JSON {type(row).__name__}, not an object with fields")
    return Sample(data[:max_rows], complete=len(data) <= max_rows)


def _csv_rows(path: Path, max_rows: int, delimiter: str) -> Sample:
    rows: list[dict[str, Any]] = []
    # utf-8-sig, as the runner reads it: a byte-order mark is not part of the first column's name
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        for row in reader:
            rows.append(row)
            if len(rows) >= max_rows:
                return Sample(rows, complete=next(reader, None) is None, csv=True)
    return Sample(rows, complete=True, csv=True)


def _parquet_rows(path: Path, max_rows: int) -> Sample:
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(str(path))
    except Exception as exc:  # pyarrow's ArrowInvalid and friends: not a parquet file
        raise SampleError(f"is not a parquet file ({str(exc).splitlines()[0][:200]})") from None
    batch = next(file.iter_batches(batch_size=max_rows), None)
    rows = batch.to_pylist() if batch is not None else []
    return Sample(rows, complete=file.metadata.num_rows <= max_rows)
