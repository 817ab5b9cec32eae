"""Reading a run's TensorBoard folder with TensorBoard's own reader (the `tensorboard` package,
in the test extra), the way its dashboard shows the curves: files in name order, and a resumed
attempt's SessionLog START hiding what earlier files logged from its step on."""

from __future__ import annotations

import math
from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator

FILE_PREFIX = "events.out.tfevents."


def event_files(folder: str | Path) -> list[Path]:
    return sorted(p for p in Path(folder).glob(FILE_PREFIX + "*") if p.is_file())


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard shows them."""
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def same_value(a: float, b: float) -> bool:
    """A float32 event value against the CSV's float: equal to float32 precision (NaN == NaN)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)
