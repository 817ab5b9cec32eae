"""benchmarks/preemption.py's report: the per-pair figures summarised (median, quartiles, range)
and printed. The measuring is in preemption.py."""

from __future__ import annotations

import statistics
from typing import Any

GOAL_RATIO = 1.5  # orch's notice checkpoint over a bare torch.save + fsync, per pair (median)


def spread(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "min": values[0], "max": values[-1], "q1": q[0], "q3": q[2]}


def summarise(raw: dict[str, Any], batch: int, seq: int) -> dict[str, Any]:
    pairs, starts = raw["pairs"], raw["starts"]
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return {
        "model": "BertForSequenceClassification(BertConfig()) + AdamW, random init, CPU",
        "batch": batch,
        "seq": seq,
        "goal_ratio": GOAL_RATIO,
        "pairs_n": len(pairs),
        "ratio": spread([p["ratio"] for p in pairs]),
        "orch_save_s": spread([p["orch"]["save_s"] for p in pairs]),
        "bare_save_s": spread([p["bare"]["save_s"] for p in pairs]),
        "orch_parts_median_s": {k: med([p["orch"][k] for p in pairs]) for k in ("write_s", "fsync_s", "rename_s")},
        "bare_parts_median_s": {k: med([p["bare"][k] for p in pairs]) for k in ("write_s", "fsync_s")},
        "orch_mb": pairs[0]["orch"]["bytes"] / 1e6,
        "bare_mb": pairs[0]["bare"]["bytes"] / 1e6,
        "steps_lost": [p["orch"]["steps_lost"] for p in pairs],
        "step_in_flight_s": spread([p["orch"]["step_in_flight_s"] for p in pairs]),
        "sigterm_to_exit_s": spread([p["orch"]["sigterm_to_exit_s"] for p in pairs]),
        "after_save_s": spread([p["orch"]["after_save_s"] for p in pairs]),
        "cold_first_step_s": [s["cold_first_step_s"] for s in starts],
        "resumed_first_step_s": [s["resumed_first_step_s"] for s in starts],
        "resumed_minus_cold_s": spread([s["resumed_minus_cold_s"] for s in starts]),
        "checkpoint_load_alone_s": spread([s["load_s"] for s in starts]),
        "resume_overhead_beyond_load_s": spread([s["resumed_minus_cold_s"] - s["load_s"] for s in starts]),
        "start_up_resumed_minus_cold_s": spread([s["start_up_resumed_minus_cold_s"] for s in starts]),
        "start_up_overhead_beyond_load_s": spread([s["start_up_resumed_minus_cold_s"] - s["load_s"] for s in starts]),
        "first_batch_resumed_minus_cold_s": spread([s["first_batch_resumed_minus_cold_s"] for s in starts]),
        "raw": raw,
    }


def render(rep: dict[str, Any]) -> None:
    def fmt(s: dict[str, float], digits: int = 2) -> str:
        return (
            f"median {s['median']:.{digits}f} (quartiles {s['q1']:.{digits}f}-{s['q3']:.{digits}f}, "
            f"range {s['min']:.{digits}f}-{s['max']:.{digits}f})"
        )

    pairs = rep["raw"]["pairs"]
    print(f"BERT-base + AdamW, batch {rep['batch']} x seq {rep['seq']}, CPU; {rep['pairs_n']} pairs, arms alternated")
    print(
        f"  checkpoint: orch {rep['orch_mb']:.0f} MB (Lightning: weights, AdamW, loops, RNG, ...), "
        f"bare {rep['bare_mb']:.0f} MB"
    )
    print("  per pair, end of step -> durable file (s):")
    for p in pairs:
        o, b = p["orch"], p["bare"]
        print(
            f"    attempt {p['attempt']} ({p['order']}): orch {o['save_s']:.2f} (write {o['write_s']:.2f}, fsync "
            f"{o['fsync_s']:.2f}, rename {o['rename_s']:.2f}) | bare {b['save_s']:.2f} (write {b['write_s']:.2f}, "
            f"fsync {b['fsync_s']:.2f}) | ratio {p['ratio']:.2f}"
        )
    print(f"  ratio orch/bare per pair: {fmt(rep['ratio'])}  (goal <= {GOAL_RATIO})")
    print(f"  orch save s: {fmt(rep['orch_save_s'])}")
    print(f"  bare save s: {fmt(rep['bare_save_s'])}")
    print(f"  SIGTERM -> end of the step in flight (s): {fmt(rep['step_in_flight_s'])}")
    print(f"  SIGTERM -> exit 75 (s): {fmt(rep['sigterm_to_exit_s'])}")
    print(f"  'saved' line -> process gone (s): {fmt(rep['after_save_s'])}")
    print(f"  steps lost: {rep['steps_lost']} (goal 0)")
    print(
        "  time to first step, cold / resumed (s): "
        + ", ".join(f"{c:.1f} / {r:.1f}" for c, r in zip(rep["cold_first_step_s"], rep["resumed_first_step_s"]))
    )
    print(f"  resumed - cold (s): {fmt(rep['resumed_minus_cold_s'])}")
    print(f"  reading + loading the checkpoint alone (s): {fmt(rep['checkpoint_load_alone_s'])}")
    print(f"  resumed - cold - load alone (s): {fmt(rep['resume_overhead_beyond_load_s'])}")
    print(
        f"    of which launch -> training starts, resumed - cold (s): {fmt(rep['start_up_resumed_minus_cold_s'])}; "
        f"minus load alone: {fmt(rep['start_up_overhead_beyond_load_s'])}"
    )
    print(f"    and the first batch itself, resumed - cold (s): {fmt(rep['first_batch_resumed_minus_cold_s'])}")
