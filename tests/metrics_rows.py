"""metrics.csv of two runs, row for row: an interrupted run must log what an uninterrupted one
logs (issue 31: a notice dropped the validation of its step). Timing columns are left out: they
are the only values a resume may change."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from orchestrator.contract import METRICS_CSV

TIMING = frozenset({"samples_per_s"})


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every row of RUN_DIR/metrics.csv as {column: text}, empty cells and timing columns left out."""
    with open(Path(run_dir) / METRICS_CSV, newline="", encoding="utf-8") as fh:
        return [{k: v for k, v in row.items() if k and k not in TIMING and v != ""} for row in csv.DictReader(fh)]


def validation_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if any(k.startswith("val_") for k in r)]


def assert_same_metrics(expected_dir: Path, got_dir: Path) -> None:
    """The validation rows (step, epoch, every val_ metric), then every row, exactly equal."""
    expected, got = metric_rows(expected_dir), metric_rows(got_dir)
    want, have = validation_rows(expected), validation_rows(got)
    steps_want, steps_have = [r.get("step") for r in want], [r.get("step") for r in have]
    assert want == have, (
        f"validation rows differ: {len(want)} expected, {len(have)} logged; steps missing "
        f"{sorted(set(steps_want) - set(steps_have), key=int)}, extra {sorted(set(steps_have) - set(steps_want), key=int)}, "
        f"twice {sorted({s for s in steps_have if steps_have.count(s) > 1}, key=int)}; first difference "
        f"{next(((a, b) for a, b in zip(want, have) if a != b), None)}"
    )
    assert expected == got, (
        f"metrics.csv rows differ ({len(expected)} expected, {len(got)} logged); first difference "
        f"{next(((a, b) for a, b in zip(expected, got) if a != b), None)}"
    )
