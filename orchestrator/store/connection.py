"""The store's SQLite connection: one per thread (read-only for the dashboard and doctor), the
BEGIN IMMEDIATE transaction every write runs in, and the migrations run on open."""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..model.errors import OrchError
from .schema import MIGRATIONS, SCHEMA_VERSION


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The rowid an INSERT just made (sqlite3 types it Optional; after an INSERT it is set)."""
    if cur.lastrowid is None:
        raise OrchError("the store inserted a row but reported no id")
    return cur.lastrowid


class StoreConnection:
    """The connection, transactions and migrations under every part of the Store."""

    def __init__(self, path: Path | str, *, read_only: bool = False):
        """`read_only`: the queries on a read-only connection (the dashboard, `orch doctor`): no
        file is created, nothing migrated, and any write raises."""
        self.path = Path(path)
        self.read_only = read_only
        self._local = threading.local()
        if read_only:
            return
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        self._migrate()

    @property
    def db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect_read_only() if self.read_only else self._connect()
            self._local.conn = conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=60000")
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise OrchError(f"no orch state at {self.path.parent} yet: submit a job first")
        conn = sqlite3.connect(
            f"file:{self.path}?mode=ro", uri=True, timeout=5, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=5000")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            conn.close()
            raise OrchError(
                f"{self.path} has schema {version}; this orch reads {SCHEMA_VERSION} "
                "(run any other orch command once to migrate it)"
            )
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise OrchError(f"{self.path} is open read-only here")
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _migrate(self) -> None:
        # Read first: a current database (every command but the first) needs no write lock, so
        # `orch status` never queues behind the daemon's writes just to open the store.
        if self._check_version(self.db.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION:
            return
        with self._tx() as db:
            version = self._check_version(db.execute("PRAGMA user_version").fetchone()[0])
            for v in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[v].split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _check_version(self, version: int) -> int:
        if version > SCHEMA_VERSION:
            raise OrchError(
                f"{self.path} was written by a newer orch (schema {version}, this orch knows {SCHEMA_VERSION}); "
                "upgrade orch (pip install -U orch-gpu), or point --home / ORCH_HOME at another folder"
            )
        return version

    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]
