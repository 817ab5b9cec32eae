"""What `orch doctor` asks of the database file itself, on a read-only connection that never
creates, migrates or locks anything: SQLite's integrity verdict, the schema version, and the
newest event's time (to tell a clock that went backwards)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# What a caller catches when the file cannot be read at all (locked, not a database, no access).
StoreReadError = sqlite3.Error


@dataclass(frozen=True)
class DatabaseCheck:
    problems: list[str]  # SQLite's integrity_check lines; empty when it says "ok"
    version: int  # PRAGMA user_version: the schema version the file is at


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)


def check_database(path: Path) -> DatabaseCheck:
    """SQLite's own integrity check and the schema version. Raises StoreReadError."""
    con = _read_only(path)
    try:
        verdict = [r[0] for r in con.execute("PRAGMA integrity_check").fetchall()]
        version = con.execute("PRAGMA user_version").fetchone()[0]
    finally:
        con.close()
    return DatabaseCheck([] if verdict == ["ok"] else verdict, int(version))


def newest_event_at(path: Path) -> Optional[float]:
    """When the newest recorded event happened, or None (no events, or the file cannot be read)."""
    try:
        con = _read_only(path)
        try:
            latest = con.execute("SELECT MAX(at) FROM events").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return None if latest is None else float(latest)
