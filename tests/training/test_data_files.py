"""The data files the built-in runner reads (training/builtin/data.py's load_split, real
`datasets`): a .tsv by its tabs, a CSV with a UTF-8 byte-order mark without the mark in its first
column's name, and a type it cannot read refused naming the field, the file and the types it can."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.builtin.data import load_split
from training.builtin.rows import DataError

ROWS = [("a good film", 1), ("a bad film", 0), ("great", 1)]


def test_a_tsv_file_is_read_by_its_tabs(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in ROWS))
    ds = load_split(str(path), "train")
    assert ds.column_names == ["text", "label"]
    assert list(zip(ds["text"], ds["label"])) == ROWS


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_bytes(("\ufefftext,label\n" + "".join(f"{t},{y}\n" for t, y in ROWS)).encode("utf-8"))
    ds = load_split(str(path), "train")
    assert ds.column_names == ["text", "label"]


def test_a_type_the_runner_cannot_read_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "train.xlsx"
    path.write_bytes(b"PK\x03\x04" + bytes(196))
    with pytest.raises(DataError) as caught:
        load_split(str(path), "train")
    assert str(caught.value) == (
        f"data.train: {path} is an unsupported file type (.xlsx): use csv, tsv, json, jsonl or parquet"
    )
