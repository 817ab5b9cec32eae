"""The dashboard's sweep data: the sweeps in a list for the queue page, and one sweep's page
(`orch sweep show`'s summary plus every trial's objective against its step, pruned ones marked)."""

from __future__ import annotations

from typing import Any

from ..home.paths import Home
from ..store import Store
from ..sweeps import objective
from ..sweeps.summary import describe_params, summarize


def sweeps(store: Store) -> list[dict[str, Any]]:
    out = []
    for sweep in store.sweeps():
        trials = store.trials(sweep.id)
        out.append(
            {
                "id": sweep.id,
                "name": sweep.name,
                "state": sweep.state.value,
                "trials": len(trials),
                "planned": sweep.spec["sweep"]["trials"],
                "objective": sweep.spec["sweep"]["objective"],
            }
        )
    return out


def sweep(store: Store, home: Home, sweep_id: int, currency: str) -> dict[str, Any]:
    summary = summarize(store, home, store.sweep(sweep_id))
    name = summary["objective"]
    curves, markers = [], []
    for trial in sorted(summary["trials"], key=lambda t: t["number"]):
        points = [[step, value] for step, value in objective.series(home.run_dir(trial["id"]), name)]
        label = f"job {trial['id']} ({describe_params(trial['params'])})"
        curves.append(
            {
                "name": label + (" · pruned" if trial["state"] == "pruned" else ""),
                "job": trial["id"],
                "state": trial["state"],
                "points": points,
            }
        )
        if trial["state"] == "pruned" and points:
            markers.append(
                {"step": points[-1][0], "kind": "pruned", "label": f"{label} pruned at step {points[-1][0]}"}
            )
        trial["params_text"] = describe_params(trial["params"])
    return {**summary, "curves": curves, "markers": markers, "currency": currency}
