"""benchmarks/market.py --zones: the tasks for one region's zones (every trace a zone, each start
one job that may use any zone) -- orch, Uniform Progress and on-demand only across the zones
through the real controller with [[recovery.zones]], Uniform Progress in each zone alone, and the
oracle on the zones' union (spot wherever some zone has it, free to change zones: a lower bound)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..common import BadTraces

ACROSS = ("orch", "uniform_progress", "on_demand")


def zone_tasks(
    zone_values: dict[str, list[int]],
    gap: float,
    starts: list[int],
    opts: dict[str, Any],
    oracle: str,
    oracle_starts: int,
) -> tuple[list[tuple[Any, ...]], tuple[str, ...]]:
    tasks: list[tuple[Any, ...]] = []
    chunk = max(1, len(starts) // 4)
    if oracle:
        union = [max(column) for column in zip(*zone_values.values())]
        mine = starts[: max(1, oracle_starts)]
        for i in range(0, len(mine), 5):
            tasks.append((oracle, "zones", union, gap, mine[i : i + 5], opts))
    singles = tuple(f"uniform_progress@{zone}" for zone in zone_values)
    for name in ACROSS:
        for i in range(0, len(starts), chunk):
            tasks.append((name, "zones", zone_values, gap, starts[i : i + chunk], opts))
    for zone, name in zip(zone_values, singles):
        for i in range(0, len(starts), chunk):
            tasks.append((name, zone, zone_values[zone], gap, starts[i : i + chunk], opts))
    return tasks, ACROSS + singles


def load_prices(path: Path, zones: list[str], price_ratio: float) -> dict[str, tuple[float, float]]:
    """{"zone": {"spot": x, "on_demand": y}} -> zone -> (spot, on-demand); a zone not in the file is
    priced as the default (spot 1, on-demand --price-ratio)."""
    try:
        raw = json.loads(path.read_text())
        out = {z: (float(raw[z]["spot"]), float(raw[z]["on_demand"])) for z in raw}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadTraces(f"{path}: not a prices file ({exc})") from None
    unknown = sorted(set(out) - set(zones))
    if unknown or any(spot <= 0 or od <= 0 for spot, od in out.values()):
        raise BadTraces(f"{path}: prices must be > 0, for zones among {zones} (got {sorted(out)})")
    return {z: out.get(z, (1.0, price_ratio)) for z in zones}
