"""The market policy on public spot traces: every job replayed through the real recovery controller
(its pass loop, claims, planned moves and policy) against a simulated cloud whose spot market
follows an availability trace (benchmarks/marketsim/). Beside orch's policy, the same controller
runs the baselines of "Can't Be Late" (Wu et al., NSDI'24): Greedy, Uniform Progress and
on-demand only.

    python -m benchmarks.market TRACE_DIR [--starts 300] [--job-hours 48] [--deadline-hours 60]
        [--changeover-hours 0.2] [--price-ratio 3.14] [--seed 0] [--reverse] [--shuffle-spells]
        [--oracle] [--jobs-per-machine N] [--workers 2] [--json]

TRACE_DIR holds traces in the skypilot-org/spot-traces format ({"metadata": {"gap_seconds": 600},
"data": [1, 0, ...]}, 1 = spot can be had). Per policy: billed on-demand and spot machine hours
per job (changeovers included), cost / on-demand only, deadlines missed, jobs given up; and the
paper's own accounting (the hours of work done on each market, changeovers not billed), which is
what its Table 3 reports. Held-out checks that no figure depends on the traces' particular order:
`--reverse` replays every trace backwards; `--shuffle-spells` rebuilds each trace from its own
spells of spot and of no spot in a random order (seeded by --seed: the same lengths, the same
share of spot, another history). `--oracle` adds what a scheduler that knows the trace's future
would pay for the same jobs (marketsim/oracle.py), a lower bound for any policy.
`--jobs-per-machine N` makes each start N jobs with different deadlines that begin together on one
machine (marketsim/packed.py): one row per job, the machines' hours shared among their jobs."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import BadTraces
from .marketsim.report import ORACLE, POLICIES, print_tables, summarize

TAIL_H = 24.0  # trace kept after the deadline, so a late job can still finish and be counted late


def shuffle_spells(values: list[int], rng: random.Random) -> list[int]:
    """The trace's spells (runs of 1s and of 0s) in a random order, alternating as before."""
    spells: list[list[int]] = []
    for v in values:
        if spells and spells[-1][0] == v:
            spells[-1][1] += 1
        else:
            spells.append([v, 1])
    ups = [n for v, n in spells if v]
    downs = [n for v, n in spells if not v]
    rng.shuffle(ups)
    rng.shuffle(downs)
    first, second = (ups, downs) if values and values[0] else (downs, ups)
    out: list[int] = []
    for i in range(max(len(first), len(second))):
        for group in (first, second):
            if i < len(group):
                out += [1 if group is ups else 0] * group[i]
    return out


def load_traces(folder: Path, reverse: bool) -> dict[str, tuple[list[int], float]]:
    traces = {}
    for path in sorted(folder.glob("*.json")):
        try:
            raw = json.loads(path.read_text())
            values = [1 if int(v) > 0 else 0 for v in raw["data"]]
            gap = float((raw.get("metadata") or {}).get("gap_seconds") or 600)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BadTraces(f"{path}: not a spot trace ({exc})") from None
        traces[path.stem] = (values[::-1] if reverse else values, gap)
    if not traces:
        raise BadTraces(f"{folder}: no *.json traces")
    return traces


def starts_for(values: list[int], gap: float, n: int, horizon_h: float, rng: random.Random) -> list[int]:
    room = len(values) - int((horizon_h + TAIL_H) * 3600 / gap)
    if room <= 0:
        raise BadTraces(f"a trace of {len(values)} ticks is too short for {horizon_h} h + {TAIL_H} h")
    return [rng.randrange(0, room) for _ in range(n)]


def _run(task: tuple[Any, ...]) -> tuple[str, list[tuple[Any, ...]]]:
    policy_name, trace, values, gap, starts, opts = task
    if policy_name == ORACLE:
        return policy_name, _oracle(trace, values, gap, starts, opts)
    from .marketsim import baselines
    from .marketsim.replay import open_store, replay, sim_config

    from orchestrator.recovery.policy import decide

    policy = decide if policy_name.split("@")[0] == "orch" else baselines.POLICIES[policy_name.split("@")[0]]
    prices = opts.get("prices") or {}  # zone -> (spot, on-demand) per hour
    zones = {z: prices.get(z, (1.0, opts["price_ratio"])) for z in values} if isinstance(values, dict) else None
    config = sim_config(changeover_h=opts["changeover_h"], price_ratio=opts["price_ratio"], zones=zones)
    out: list[tuple[Any, ...]] = []
    seen: dict[Any, Any] = {}  # spot lifetimes observed on this trace (per zone), across its jobs
    ram = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(
        prefix="orch-market-", dir=ram
    ) as tmp:  # the controller's SQLite, in memory where it can
        store = open_store(Path(tmp))
        for start in sorted(starts):
            if opts.get("per_machine", 1) > 1:
                out += _packed(trace, values, gap, start, policy, config, store, seen, opts, zones)
                continue
            r = replay(
                values,
                gap,
                start,
                policy,
                config=config,
                store=store,
                job_h=opts["job_h"],
                deadline_h=opts["deadline_h"],
                seen=seen,
                handover_h=opts["handover_h"],
            )
            cost = r.od_h + r.spot_h / opts["price_ratio"]  # in on-demand hours
            if zones:  # each machine at its zone's price, in hours of the cheapest on-demand
                od_ref = min(od for _, od in zones.values())
                cost = sum(
                    (m.end_at - m.launched_at) / 3600 * zones[m.zone][0 if m.market == "spot" else 1] / od_ref
                    for m in r.world.machines.values()
                )
            out.append(
                (trace, start, r.od_h, r.spot_h, r.od_work_h, r.spot_work_h, r.missed, r.given_up, r.machines, cost)
            )
        store.close()
    return policy_name, out


def _packed(
    trace: str,
    values: Any,
    gap: float,
    start: int,
    policy: Any,
    config: Any,
    store: Any,
    seen: dict[Any, Any],
    opts: dict[str, Any],
    zones: Any,
) -> list[tuple[Any, ...]]:
    """--jobs-per-machine: one row per job of the start's N (marketsim/packed.py)."""
    from .marketsim.packed import deadlines_h, replay_packed

    r = replay_packed(
        values,
        gap,
        start,
        policy,
        config=config,
        store=store,
        job_h=opts["job_h"],
        deadlines=deadlines_h(opts["job_h"], opts["deadline_h"], opts["per_machine"]),
        seen=seen,
        handover_h=opts["handover_h"],
    )
    k = opts["price_ratio"]
    od_ref = min(od for _, od in zones.values()) if zones else k

    def cost_of(box: Any) -> float:  # one GPU's hours at its market's price, in on-demand hours
        price = zones[box.zone][0 if box.market == "spot" else 1] if zones else (1.0 if box.market == "spot" else k)
        return (box.end_at - box.launched_at) / 3600 * price / od_ref

    return r.rows(trace, start, cost_of)


def _oracle(
    trace: str, values: list[int], gap: float, starts: list[int], opts: dict[str, Any]
) -> list[tuple[Any, ...]]:
    from .marketsim.oracle import job_cost_h

    args = {k: opts[k] for k in ("job_h", "deadline_h", "changeover_h", "price_ratio", "handover_h")}
    out: list[tuple[Any, ...]] = []
    for start in starts:
        billed = job_cost_h(values, gap, start, **args)
        paper = job_cost_h(values, gap, start, **args, paper=True)
        if billed is None or paper is None:
            return []  # too fine a grid: no oracle row
        out.append((trace, start, billed, paper))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--starts", type=int, default=300, help="random start points per trace")
    ap.add_argument("--job-hours", type=float, default=48.0)
    ap.add_argument("--deadline-hours", type=float, default=60.0, help="after the start")
    ap.add_argument("--changeover-hours", type=float, default=0.2)
    ap.add_argument(
        "--handover-minutes",
        type=float,
        default=5.0,
        help="what every adoption and planned move costs the job: billed, no progress",
    )
    ap.add_argument("--price-ratio", type=float, default=3.14, help="on-demand price / spot price")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reverse", action="store_true", help="replay each trace backwards (a held-out check)")
    ap.add_argument(
        "--shuffle-spells", action="store_true", help="replay each trace with its spells reordered (a held-out check)"
    )
    ap.add_argument(
        "--oracle", action="store_true", help="also what a scheduler that knows the future would pay (a lower bound)"
    )
    ap.add_argument("--oracle-starts", type=int, default=30, help="the oracle's starts per trace (the first N)")
    ap.add_argument(
        "--zones",
        action="store_true",
        help="every trace in the folder is one zone of one region; each start is one job that may use any zone",
    )
    ap.add_argument(
        "--prices",
        type=Path,
        help='with --zones: a JSON file {"zone": {"spot": 0.97, "on_demand": 3.06}} (per hour; default: equal)',
    )
    ap.add_argument(
        "--jobs-per-machine",
        type=int,
        default=1,
        help="N jobs with different deadlines (the slack spread evenly up to --deadline-hours) start on one machine",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if (
        args.starts < 1
        or args.job_hours <= 0
        or args.deadline_hours < args.job_hours
        or args.price_ratio < 1
        or args.handover_minutes < 0
        or args.jobs_per_machine < 1
        or (args.jobs_per_machine > 1 and args.oracle)
    ):
        print(
            "--starts >= 1, --job-hours > 0, --deadline-hours >= --job-hours, --price-ratio >= 1, "
            "--handover-minutes >= 0, --jobs-per-machine >= 1 (and without --oracle: the oracle is per job)",
            file=sys.stderr,
        )
        return 2
    rng = random.Random(args.seed)
    try:
        traces = load_traces(args.trace_dir, args.reverse)
        if args.shuffle_spells:
            shuffler = random.Random(f"spells-{args.seed}")
            traces = {name: (shuffle_spells(v, shuffler), g) for name, (v, g) in traces.items()}
        if args.zones:
            return _main_zones(args, traces, rng)
        starts = {name: starts_for(v, g, args.starts, args.deadline_hours, rng) for name, (v, g) in traces.items()}
    except BadTraces as exc:
        print(f"market.py: {exc}", file=sys.stderr)
        return 2
    opts = _opts(args)
    tasks = []
    for trace, (values, gap) in traces.items():
        chunk = max(1, len(starts[trace]) // 4)  # a few tasks per trace and policy: both workers busy to the end
        if args.oracle:
            mine = starts[trace][: max(1, args.oracle_starts)]
            for i in range(0, len(mine), 5):
                tasks.append((ORACLE, trace, values, gap, mine[i : i + 5], opts))
        for name in POLICIES:
            for i in range(0, len(starts[trace]), chunk):
                tasks.append((name, trace, values, gap, starts[trace][i : i + chunk], opts))
    rows: dict[str, list[tuple[Any, ...]]] = {name: [] for name in POLICIES + (ORACLE,)}
    with multiprocessing.get_context("spawn").Pool(max(1, args.workers)) as pool:
        for name, got in pool.imap_unordered(_run, tasks):
            rows[name] += got
    result = summarize(rows, args.price_ratio, args.job_hours)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"{len(traces)} trace(s) x {args.starts} starts: {args.job_hours:g} h of work, deadline {args.deadline_hours:g} h, "
        f"changeover {args.changeover_hours:g} h, hand-over {args.handover_minutes:g} min, "
        f"on-demand = {args.price_ratio:g} x spot"
        + (", traces reversed" if args.reverse else "")
        + (", spells shuffled" if args.shuffle_spells else "")
        + (f", {args.jobs_per_machine} jobs per machine" if args.jobs_per_machine > 1 else "")
    )
    print_tables(result)
    return 0


def _opts(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "job_h": args.job_hours,
        "deadline_h": args.deadline_hours,
        "changeover_h": args.changeover_hours,
        "handover_h": args.handover_minutes / 60,
        "price_ratio": args.price_ratio,
        "per_machine": args.jobs_per_machine,
    }


def _main_zones(args: argparse.Namespace, traces: dict[str, tuple[list[int], float]], rng: random.Random) -> int:
    """--zones: the traces are one region's zones, side by side in time (cut to the shortest)."""
    from .marketsim.across import load_prices, zone_tasks

    gaps = {g for _, g in traces.values()}
    if len(gaps) != 1:
        raise BadTraces(f"{args.trace_dir}: with --zones every trace needs the same gap_seconds (got {sorted(gaps)})")
    gap = gaps.pop()
    n = min(len(v) for v, _ in traces.values())
    zone_values = {name: v[:n] for name, (v, _) in traces.items()}
    starts = starts_for(next(iter(zone_values.values())), gap, args.starts, args.deadline_hours, rng)
    opts = _opts(args)
    opts["prices"] = load_prices(args.prices, list(zone_values), args.price_ratio) if args.prices else {}
    tasks, policies = zone_tasks(zone_values, gap, starts, opts, ORACLE if args.oracle else "", args.oracle_starts)
    rows: dict[str, list[tuple[Any, ...]]] = {name: [] for name in policies + (ORACLE,)}
    with multiprocessing.get_context("spawn").Pool(max(1, args.workers)) as pool:
        for name, got in pool.imap_unordered(_run, tasks):
            rows[name] += got
    result = summarize(rows, args.price_ratio, args.job_hours, policies)
    singles = {k: v for k, v in result.items() if "@" in k}
    if singles:
        costs = [r["cost_vs_on_demand"] for r in singles.values()]
        result["uniform_progress single zone"] = {
            "mean": round(sum(costs) / len(costs), 4),
            "best": min(costs),
            "best_zone": min(singles, key=lambda k: singles[k]["cost_vs_on_demand"]).split("@")[1],
        }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"{len(zone_values)} zones ({', '.join(zone_values)}) x {args.starts} starts: {args.job_hours:g} h of work, "
        f"deadline {args.deadline_hours:g} h, changeover {args.changeover_hours:g} h, hand-over "
        f"{args.handover_minutes:g} min"
    )
    single = result.pop("uniform_progress single zone", None)
    print_tables(result)
    if single:
        print(
            f"uniform_progress in one zone alone: mean {single['mean']:.3f}, best {single['best']:.3f} "
            f"({single['best_zone']})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
