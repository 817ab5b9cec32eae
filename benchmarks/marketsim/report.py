"""benchmarks/market.py's figures from its rows: per policy the billed and the paper's cost against
on-demand only, deadlines missed, jobs given up, machines per job, the oracle's distance per
trace; and the tables it prints."""

from __future__ import annotations

from typing import Any

POLICIES = ("orch", "greedy", "uniform_progress", "on_demand")
ORACLE = "oracle"  # --oracle: the cheapest schedule knowing the trace's future (marketsim/oracle.py)


def _cost(row: tuple[Any, ...], k: float) -> float:
    return float(row[9]) if len(row) > 9 else float(row[2] + row[3] / k)


def summarize(
    rows: dict[str, list[tuple[Any, ...]]], k: float, job_h: float, policies: tuple[str, ...] = POLICIES
) -> dict[str, dict[str, Any]]:
    """Per policy: billed hours and cost / on-demand only (the headline: every machine hour,
    boots and hand-overs included), deadlines missed, jobs given up, machines per job, and the
    paper's accounting (hours of work only). With oracle rows: its cost, and per trace how far
    orch and Uniform Progress are above it on the same starts."""

    def mean(name: str, i: int) -> float:
        return sum(float(r[i]) for r in rows[name]) / max(len(rows[name]), 1)

    def cost(name: str) -> float:
        return sum(_cost(r, k) for r in rows[name]) / max(len(rows[name]), 1)

    od_only = cost("on_demand")
    out: dict[str, dict[str, Any]] = {}
    for name in policies:
        od_h, spot_h = mean(name, 2), mean(name, 3)
        od_work, spot_work = mean(name, 4), mean(name, 5)
        out[name] = {
            "od_h": round(od_h, 2),
            "spot_h": round(spot_h, 2),
            "cost_vs_on_demand": round(cost(name) / od_only, 4),
            "missed": int(sum(bool(r[6]) for r in rows[name])),
            "given_up": int(sum(bool(r[7]) for r in rows[name])),
            "machines": round(mean(name, 8), 2),
            "runs": len(rows[name]),
            "paper": {  # the paper's accounting: hours of work on each market
                "od_h": round(od_work, 2),
                "spot_h": round(spot_work, 2),
                "cost_vs_on_demand": round((od_work + spot_work / k) / job_h, 4),
            },
        }
    if rows.get(ORACLE):
        n = len(rows[ORACLE])
        out[ORACLE] = {
            "cost_vs_on_demand": round(sum(r[2] for r in rows[ORACLE]) / n / od_only, 4),
            "runs": n,
            "paper": {"cost_vs_on_demand": round(sum(r[3] for r in rows[ORACLE]) / n / job_h, 4)},
            "per_trace": _oracle_distance(rows, k, [p for p in ("orch", "uniform_progress") if p in policies]),
        }
    return out


def _oracle_distance(rows: dict[str, list[tuple[Any, ...]]], k: float, names: list[str]) -> dict[str, dict[str, Any]]:
    """Per trace, on the starts the oracle ran: its mean billed cost (on-demand hours per job) and
    each policy's cost / the oracle's."""
    per: dict[str, dict[str, Any]] = {}
    oracle: dict[tuple[str, int], tuple[Any, ...]] = {(r[0], r[1]): r for r in rows[ORACLE]}
    for trace in sorted({r[0] for r in rows[ORACLE]}):
        keys = [key for key in oracle if key[0] == trace]
        bound = sum(oracle[key][2] for key in keys) / len(keys)
        entry: dict[str, Any] = {"starts": len(keys), "oracle_h": round(bound, 2)}
        for name in names:
            mine = {(r[0], r[1]): r for r in rows[name] if (r[0], r[1]) in oracle}
            got = [_cost(mine[key], k) for key in keys if key in mine]
            if got:
                entry[name] = round(sum(got) / len(got) / bound, 4)
        per[trace] = entry
    return per


def print_tables(result: dict[str, dict[str, Any]]) -> None:
    print("billed (every machine hour: boots and hand-overs included)")
    print(
        f"{'policy':<17} {'on-demand h':>11} {'spot h':>7} {'cost/OD':>8} {'missed':>7} {'given up':>9} {'machines':>9}"
    )
    for name, r in result.items():
        if name == ORACLE:
            print(f"{'oracle (future)':<17} {'-':>11} {'-':>7} {r['cost_vs_on_demand']:>8.3f}   ({r['runs']} starts)")
            continue
        print(
            f"{name:<17} {r['od_h']:>11.1f} {r['spot_h']:>7.1f} {r['cost_vs_on_demand']:>8.3f} {r['missed']:>7} "
            f"{r['given_up']:>9} {r['machines']:>9.1f}"
        )
    print("the paper's accounting (hours of work on each market; boots and hand-overs free)")
    for name, r in result.items():
        p = r["paper"]
        hours = "" if name == ORACLE else f"{p['od_h']:.1f} / {p['spot_h']:.1f} h"
        print(f"{name:<17} {hours:>15} {p['cost_vs_on_demand']:>8.3f}")
    if ORACLE in result:
        print("per trace, billed, on the oracle's starts: cost / the oracle's")
        for trace, e in result[ORACLE]["per_trace"].items():
            rest = "  ".join(f"{k} {v:.3f}" for k, v in e.items() if k not in ("starts", "oracle_h"))
            print(f"{trace:<24} {e['starts']:>4} starts, oracle {e['oracle_h']:.1f} OD h/job  {rest}")
