"""The jobs `orch watch` watches from this home, as people see them: which wait for a machine, and
one line each. `orch watch` prints the line as its rows change, `orch status` under the queue, and
the dashboard shows the same rows (store/recovery_rows.py holds them)."""

from __future__ import annotations

import time
from typing import Any

from ..model.states import WAITING_FOR_A_MACHINE
from ..store import Store

# What a row shows; `losses` tells a job a machine was lost under from one never placed yet.
_SHOWN = ("uid", "name", "state", "waiting_since", "launches", "losses", "market", "note")


def waiting_rows(store: Store) -> list[dict[str, Any]]:
    """The jobs waiting for a machine, oldest uid first. Nothing is caught: the recovery table is
    in every store this orch opens (schema 4; a read-write Store migrates on open, a read-only one
    refuses any other schema when it connects), so the "older store" once guarded against here
    cannot reach this query; a locked or broken database raises sqlite3.OperationalError, as the
    queue's own query before it does, and the CLI's group or the dashboard's handler says so."""
    return [{k: row[k] for k in _SHOWN} for row in store.recovery_rows() if row["state"] in WAITING_FOR_A_MACHINE]


def waiting_line(row: dict[str, Any], now: float) -> str:
    """One watched job for people: `orch watch`'s output and `orch status` in the controller's home."""
    from ..cost.money import format_duration

    text = f"{row['uid'][:12]}  {row['name'] or '?'}  {row['state']}"
    if row.get("waiting_since") and row["state"] in WAITING_FOR_A_MACHINE:
        since = time.strftime("%H:%M:%S", time.localtime(row["waiting_since"]))
        # a job no machine has lost waits for its first machine (`orch launch`), not a replacement
        machine = "a replacement machine" if row.get("losses") else "its first machine"
        text += f" for {machine} since {since} ({format_duration(now - row['waiting_since'])})"
    if row.get("launches"):
        text += f"; {row['launches']} launch(es)"
    if row.get("market"):
        text += f", {row['market']}"
    if row.get("note"):
        text += f"; {row['note']}"
    return text
