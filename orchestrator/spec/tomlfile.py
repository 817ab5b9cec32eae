"""Reading a TOML file: a missing file, a syntax error or an out-of-bounds value becomes one plain
line per problem (the validation of what it says is problems.py's wording). Shared by jobspec,
config and the sweep file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 images
    import tomli as tomllib

from .bounds import MAX_DEPTH, value_problems


def read_toml(path: Path, label: str, error_cls: type[Exception]) -> dict[str, Any]:
    """Parse `path`; a missing file or a syntax error becomes error_cls([one line])."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error_cls([f"{label}: no such file"]) from None
    except IsADirectoryError:
        raise error_cls([f"{label}: is a folder, not a TOML file"]) from None
    except UnicodeDecodeError as exc:
        raise error_cls(
            [f"{label}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): save it as UTF-8"]
        ) from None
    except OSError as exc:
        raise error_cls([f"{label}: cannot read: {exc}"]) from None
    text = text.removeprefix("\ufeff")  # Notepad's UTF-8 byte-order mark: TOML has none, tomllib refuses it
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message already ends with "(at line L, column C)".
        raise error_cls([f"{label}: TOML syntax error: {exc}"]) from None
    except RecursionError:
        raise error_cls([f"{label}: nested more than {MAX_DEPTH} levels deep"]) from None
    problems = value_problems(data, label)
    if problems:
        raise error_cls(problems)
    return data
