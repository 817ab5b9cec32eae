"""Is the oracle a lower bound in fact? Per start, on the first N of each trace's starts (the same
starts as `python -m benchmarks.market TRACE_DIR --starts 300`, seed 0), the oracle's billed cost
against orch's and Uniform Progress's through the real controller: the starts where a policy paid
less than the oracle (there should be none), the means, and the distance per trace.

    python -m benchmarks.oracle_check TRACE_DIR [--first 40] [--starts 300] [--workers 2]

Billed only (every machine hour, 5-minute hand-overs), Table 3's job: 48 h of work, deadline 60 h,
changeover 0.2 h, on-demand = 3.14 x spot."""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import random
from pathlib import Path
from typing import Any

from .market import ORACLE, _run, load_traces, starts_for

OPTS = {"job_h": 48.0, "deadline_h": 60.0, "changeover_h": 0.2, "handover_h": 5 / 60, "price_ratio": 3.14}


def _task(task: tuple[Any, ...]) -> tuple[str, list[tuple[Any, ...]]]:
    if task[0] != ORACLE:
        name, rows = _run(task)
        return name, [(r[0], r[1], float(r[9])) for r in rows]
    from .marketsim.oracle import job_cost_h

    _, trace, values, gap, starts, opts = task
    return ORACLE, [(trace, s, job_cost_h(values, gap, s, **opts)) for s in starts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--first", type=int, default=40, help="starts checked per trace")
    ap.add_argument("--starts", type=int, default=300, help="the market run's --starts (which fixes the starts)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    traces = load_traces(args.trace_dir, False)
    rng = random.Random(0)
    starts = {n: starts_for(v, g, args.starts, OPTS["deadline_h"], rng)[: args.first] for n, (v, g) in traces.items()}
    tasks = [
        (name, trace, v, g, starts[trace][i : i + 5], OPTS)
        for trace, (v, g) in traces.items()
        for i in range(0, len(starts[trace]), 5)
        for name in ("orch", "uniform_progress", ORACLE)
    ]
    cost: dict[tuple[str, int], dict[str, float]] = collections.defaultdict(dict)
    with multiprocessing.get_context("spawn").Pool(max(1, args.workers)) as pool:
        for name, rows in pool.imap_unordered(_task, tasks):
            for trace, start, c in rows:
                cost[(trace, start)][name] = c
    od = OPTS["job_h"] + OPTS["changeover_h"] + OPTS["handover_h"]  # on-demand only, in on-demand hours
    under = [k for k, v in cost.items() if min(v["orch"], v["uniform_progress"]) < v[ORACLE] - 1e-6]
    print(f"{len(cost)} starts; a policy under the oracle on {len(under)}{': ' + str(under[:5]) if under else ''}")
    for name in ("orch", "uniform_progress", ORACLE):
        print(f"{name:<17} {sum(v[name] for v in cost.values()) / len(cost) / od:.4f} billed / on-demand only")
    for trace in traces:
        mine = [v for (t, _), v in cost.items() if t == trace]
        bound = sum(v[ORACLE] for v in mine)
        print(
            f"{trace:<24} oracle {bound / len(mine) / od:.3f}  orch / oracle "
            f"{sum(v['orch'] for v in mine) / bound:.3f}  uniform_progress / oracle "
            f"{sum(v['uniform_progress'] for v in mine) / bound:.3f}"
        )


if __name__ == "__main__":
    main()
