"""Reading a run's metrics.csv (written by the runner through Lightning's CSV logger): one row per
logged step, a column per metric, empty cells where a row does not carry that metric. Used by the
dashboard and the loss-curve picture of end-of-job messages. Standard library only."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Optional

NOT_METRICS = ("epoch", "step")

# Read again only when the file changed: the dashboard asks every few seconds.
_CACHE: dict[str, tuple[tuple[float, int], dict[str, Any]]] = {}


def _number(text: Optional[str]) -> Optional[float]:
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return None


def read_metrics(path: str | Path) -> dict[str, Any]:
    """{"rows": N, "columns": [metric, ...], "series": {metric: [[step, value], ...]}} in file
    order; a value that is NaN or infinite is kept as None (JSON has no NaN) and listed in
    "nonfinite". A missing or unreadable file gives zero rows."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return {"rows": 0, "columns": [], "series": {}, "nonfinite": {}}
    key = (st.st_mtime, st.st_size)
    cached = _CACHE.get(str(path))
    if cached and cached[0] == key:
        return cached[1]
    series: dict[str, list[list[Any]]] = {}
    nonfinite: dict[str, list[int]] = {}
    rows = 0
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            columns = [c for c in (reader.fieldnames or []) if c and c not in NOT_METRICS]
            for row in reader:
                step = _number(row.get("step"))
                if step is None:
                    continue
                rows += 1
                for col in columns:
                    value = _number(row.get(col))
                    if value is None:
                        continue
                    if not math.isfinite(value):
                        nonfinite.setdefault(col, []).append(int(step))
                        series.setdefault(col, []).append([int(step), None])
                    else:
                        series.setdefault(col, []).append([int(step), value])
    except (OSError, csv.Error, UnicodeDecodeError):
        return {"rows": 0, "columns": [], "series": {}, "nonfinite": {}}
    data = {"rows": rows, "columns": [c for c in columns if c in series], "series": series, "nonfinite": nonfinite}
    _CACHE[str(path)] = (key, data)
    return data
