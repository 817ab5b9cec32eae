"""`orch status`'s data, built once: the rows of views/jobs.py with the mirror's lag, the deadline
notes and the sweep each trial belongs to. The table, `--json` and the dashboard's queue all
render these rows, so none of them lacks what another shows."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..home.paths import Home
from ..store import Store
from .deadlines import add_deadline_notes
from .jobs import status_rows
from .mirror import add_lag_notes
from .sweeps import mark_trials


def queue_view(
    store: Store, home: Home, now: float, *, include_all: bool, config: Callable[[], Optional[Any]]
) -> list[dict[str, Any]]:
    """One dict per job (the documented `status --json` keys, docs/commands.md, and more). `config` is called, and
    config.toml read, only when a row has a deadline to project (`orch status` stays fast)."""
    rows = status_rows(store, home, now, include_all=include_all)
    add_lag_notes(store, rows, now)  # [storage]: a note when the mirror lags
    add_deadline_notes(store, home, config, rows, now)  # deadline jobs only
    mark_trials(store, rows)  # "sweep": the sweep a trial belongs to
    return rows
