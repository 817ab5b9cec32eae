"""`orch status --url URL`: prints the bucket's jobs and the machines `orch watch` launched
(the rows: recovery/bucket_view.py)."""

from __future__ import annotations

from typing import Any, Optional


def print_bucket_status(
    rows: list[dict[str, Any]], url: str, machines: Optional[list[dict[str, Any]]] = None, notes: tuple[str, ...] = ()
) -> None:
    if not rows:
        print(f"no jobs in {url}")
    for r in rows:
        line = f"{r['uid'][:12]}  {r['name']}  {r['state']}"
        if r["market"]:
            line += f"  {r['market']}"
        if r["machine"]:
            line += f"  on {r['machine']}"
        if r["progress"]:
            line += f"  step {r['progress']}"
        if r["note"]:
            line += f"; {r['note']}"
        print(line)
    print_machines(machines or [], notes)


def print_machines(machines: list[dict[str, Any]], notes: tuple[str, ...] = ()) -> None:
    """The machines `orch watch` launched (its ledger in the bucket), under the jobs."""
    from ..recovery.ledger import machine_line

    if machines:
        print("machines (launched by orch watch):")
        for record in machines:
            print("  " + machine_line(record))
    for note in notes:
        print(note)


def show_bucket_status(config: Any, url: str, as_json: bool) -> None:
    """`orch status --url URL`: the table, or the rows as JSON."""
    from ..adopt.plan import storage_for
    from ..recovery.bucket_view import bucket_status
    from .context import emit_json

    status = bucket_status(storage_for(config, url, how="orch status --url s3://bucket/prefix", must_exist=True))
    if as_json:
        emit_json(status.rows_with_machines())
    else:
        print_bucket_status(status.rows, status.url, status.machines, tuple(status.notes))
