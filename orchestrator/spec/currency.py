"""The currency config.toml names, read without building the config models: `orch status` prints
money on every row and must not pay for pydantic on the way (spec/config.py's `Pricing.currency`
is the definition; a file that does not parse shows money without a currency, as before)."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def configured_currency(path: Path) -> str:
    """`[pricing] currency`, or "" when the file, the table or the key is missing or unreadable."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return ""
    pricing = raw.get("pricing")
    value = pricing.get("currency") if isinstance(pricing, dict) else None
    return value if isinstance(value, str) else ""
