"""`orch show`'s data, built once: views/jobs.py's show_data with the deadline note, the mirror,
the checkpoint interval, the tracker runs and the bill. `orch show`, `--json` and the
dashboard's job page all render this dict."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..contract import CHECKPOINT_INTERVAL, TRACKING, read_json
from ..home.paths import Home
from ..store import Store
from .bill import job_bill
from .deadlines import add_deadline_notes
from .jobs import show_data
from .mirror import mirror_view


def job_view(
    store: Store,
    home: Home,
    job_id: int,
    now: float,
    *,
    config: Callable[[], Optional[Any]],
    reveal: bool = False,
) -> dict[str, Any]:
    """`config` returns the loaded config.toml, or None when there is none (or it does not load):
    the mirror and the currency come from it."""
    data = show_data(store, home, job_id, now, reveal=reveal)
    add_deadline_notes(store, home, config, [data], now)
    cfg = config()
    job = store.get(job_id)
    run_dir = home.run_dir(job_id)
    data["mirror"] = mirror_view(store, cfg, job) if cfg is not None else None
    data["checkpoint_interval"] = read_json(run_dir / CHECKPOINT_INTERVAL)  # every = "auto"
    data["tracking"] = read_json(run_dir / TRACKING)  # what the runner's trackers wrote
    data["currency"] = cfg.pricing.currency if cfg is not None else ""
    data["bill"] = job_bill(store, home, job, now, data["currency"])
    return data
