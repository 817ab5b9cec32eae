"""The limits every value from outside obeys (job.toml, config.toml, a mirrored manifest): text
without control characters, job names fit for a file name and a terminal, integers SQLite can
store, finite floats and bounded nesting. One definition, so each edge refuses the same things."""

from __future__ import annotations

import math
import re
from typing import Any, Optional

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 32  # tables and arrays inside each other; job.toml and config.toml need about 3
NAME_MAX = 100

# C0 controls (NUL, newline, escape...), DEL and the C1 range. A tab is text in a command or an
# env value; in a [slurm] field (a line of the sbatch script) it is refused too.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROL_OR_TAB = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_problem(value: str, *, allow_tab: bool = True) -> Optional[str]:
    """Why `value` is refused (it holds a control character), or None."""
    m = (_CONTROL if allow_tab else _CONTROL_OR_TAB).search(value)
    if m is None:
        return None
    return f"holds a control character ({m.group()!r} at position {m.start()}); remove it"


def name_problem(name: str) -> Optional[str]:
    """A job name reaches file names (the TensorBoard link folder) and terminals."""
    if not name or len(name) > NAME_MAX:
        return f"must be 1 to {NAME_MAX} characters (got {len(name)})"
    if not name.isprintable():
        return "must be printable characters only (no control characters, no newline)"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "must not contain / or \\, nor be . or .. (it becomes a folder name)"
    return None


def value_problems(data: Any, label: str, path: str = "", depth: int = 0, *, finite: bool = True) -> list[str]:
    """Integers outside SQLite's 64 bits, floats that are not finite (unless `finite` is False: a
    metric may be NaN) and nesting deeper than MAX_DEPTH anywhere in a parsed document, one line
    each, naming the field."""
    where = f"{label}: {path}: " if path else f"{label}: "
    if depth > MAX_DEPTH:
        return [f"{where}nested more than {MAX_DEPTH} levels deep"]
    if isinstance(data, bool):
        return []
    if isinstance(data, int):
        if not INT64_MIN <= data <= INT64_MAX:
            return [f"{where}must be between {INT64_MIN} and {INT64_MAX} (got a {len(str(abs(data)))}-digit number)"]
        return []
    if isinstance(data, float):
        return [] if math.isfinite(data) or not finite else [f"{where}must be a finite number (got {data})"]
    out: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            out += value_problems(value, label, f"{path}.{key}" if path else str(key), depth + 1, finite=finite)
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            out += value_problems(value, label, f"{path}[{i}]", depth + 1, finite=finite)
    return out
