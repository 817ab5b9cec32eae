"""Text for people: the status table, `orch show`, durations and money. Plain string formatting
(no rich), so `orch status` over thousands of jobs stays fast."""

from __future__ import annotations

import time
from typing import Any, Optional

from ..cost.money import format_duration, format_money
from ..host.summary import provenance_lines
from ..planning.rank_memory import rank_holds

STATE_STYLE = {
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "stopped": "magenta",
    "pruned": "magenta",
    "moved": "blue",
}


def duration(seconds: Optional[float]) -> str:
    """One duration format everywhere (cost.format_duration): '45s', '12m', '3h 05m', '2d 4h'."""
    return format_duration(seconds)


def money(value: Optional[float], currency: str = "") -> str:
    """One money format everywhere (cost.format_money); '-' when unknown."""
    return "-" if value is None else format_money(value, currency)


def clock(ts: Optional[float]) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def progress(row: dict[str, Any]) -> str:
    step, total = row.get("step"), row.get("total_steps")
    if step is None:
        return "-"
    if total:
        return f"{step}/{total} ({100 * step / total:.0f}%)"
    return str(step)


def projected(row: dict[str, Any], currency: str = "") -> str:
    """'≈ 4.50' for a job that runs to its last step, '≤ 4.50' when early stopping may end it
    sooner (the projection is then an upper bound); '-' without an ETA."""
    value = row.get("projected_cost")
    if value is None:
        return "-"
    return ("≤ " if row.get("projection_is_upper_bound") else "≈ ") + money(value, currency)


_COLUMNS = ("ID", "NAME", "STATE", "ATT", "GPUS", "PROGRESS", "ETA", "RUNTIME", "COST", "PROJECTED", "NOTE")
_RIGHT = frozenset({0, 3, 4, 8, 9})
_ANSI = {"yellow": "33", "cyan": "36", "green": "32", "red": "31", "magenta": "35"}


def status_table(
    rows: list[dict[str, Any]], currency: str = "", *, color: bool = False, width: Optional[int] = None
) -> str:
    """The status table as plain aligned text (colored states when `color`). Hand-formatted, not
    rich: a rich Table over a few hundred rows costs more than the 300 ms `orch status` may take.
    With `width` (a terminal's), the NOTE column is cut to fit instead of wrapping."""
    cells = [
        [
            str(r["id"]),
            str(r["name"]),
            r["state"],
            str(r["attempt"]) if r.get("started", True) else "-",
            str(r["gpus"]),
            progress(r),
            duration(r.get("eta_s")),
            duration(r.get("runtime_s")),
            money(r.get("cost"), currency),
            projected(r, currency),
            str(r.get("reason") or ""),
        ]
        for r in rows
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(_COLUMNS)]
    if width:
        room = width - sum(widths[:-1]) - 2 * (len(_COLUMNS) - 1)
        if room >= 8:
            for c in cells:
                if len(c[-1]) > room:
                    c[-1] = c[-1][: room - 1] + "…"

    def line(values: list[str], header: bool = False) -> str:
        out = []
        for i, v in enumerate(values):
            last = i == len(values) - 1
            text = v.rjust(widths[i]) if i in _RIGHT else (v if last else v.ljust(widths[i]))
            if color and header:
                text = f"\033[1m{text}\033[0m"
            elif color and i == 2 and v in STATE_STYLE:
                text = f"\033[{_ANSI[STATE_STYLE[v]]}m{text}\033[0m"
            out.append(text)
        return "  ".join(out).rstrip()

    return "\n".join([line(list(_COLUMNS), header=True)] + [line(c) for c in cells])


def show_text(d: dict[str, Any], currency: str = "") -> str:
    lines = [
        f"job {d['id']}  {d['name']}  [{d['state']}]" + (f"  {d['reason']}" if d.get("reason") else ""),
        f"  kind:      {d['kind']}   gpus: {d['gpus']}   priority: {d['priority']}   attempt: {d['attempt']}"
        f"   retries: {d['failures']}/{d['retries']} used",
        f"  spec:      {d['spec_path']}",
        f"  run dir:   {d['run_dir']}",
    ]
    git = d.get("git") or {}
    if git.get("commit"):
        lines.append(f"  git:       {git['commit'][:12]}{' (dirty tree)' if git.get('dirty') else ''}")
    else:
        lines.append("  git:       not a git checkout")
    if d.get("provenance") is not None:
        changes = [e["detail"] for e in d.get("events") or [] if e["kind"] == "env_changed"]
        lines += provenance_lines(d["provenance"], changes, width=200)
    if d["spec"].get("command"):
        lines.append(f"  command:   {' '.join(d['spec']['command'])}   (in {d['spec'].get('workdir')})")
    else:
        m, data = d["spec"].get("model", {}), d["spec"].get("data", {})
        lines.append(f"  model:     {m.get('name_or_path')}   data: {data.get('train')}")
        held = rank_holds(d["spec"], d["gpus"])
        if held:
            lines.append(f"  ranks:     {held}")
    if d.get("after"):
        lines.append(f"  after:     {', '.join(map(str, d['after']))}")
    if d.get("not_before"):
        lines.append(f"  not before: {clock(d['not_before'])}")
    lines.append(
        f"  progress:  {progress(d)}   eta: {duration(d.get('eta_s'))}   runtime: {duration(d.get('runtime_s'))}"
    )
    if d.get("projected_cost") is not None:
        bound = (
            "an upper bound: early stopping may end it sooner"
            if d.get("projection_is_upper_bound")
            else "if it runs to its last step"
        )
        lines.append(f"  projected: {projected(d, currency)} in all ({bound})")
    budget = []
    if d.get("max_cost") is not None:
        budget.append(f"max_cost {d['max_cost']:g}")
    if d.get("max_hours") is not None:
        budget.append(f"max_hours {d['max_hours']:g}")
    lost = lost_attempt_lines(d["attempts"])
    lines.append(
        f"  cost:      {money(d['cost'], currency)}   gpu-hours: {d['gpu_hours']:.3f}"
        f"   steps lost: {d['steps_lost']}{' known' if lost else ''} ({duration(d['waste_s'])}, "
        f"{money(d['waste_cost'], currency)})" + (f"   budget: {', '.join(budget)}" if budget else "")
    )
    lines += lost
    from .bill import bill_lines
    from .deadlines import deadline_line

    deadline = deadline_line(d)
    if deadline:
        lines.append(deadline)

    lines += bill_lines(d.get("bill"), currency)
    if d["attempts"]:
        lines.append("  attempts:")
        for a in d["attempts"]:
            how = a["outcome"] or ("running" if a["ended_at"] is None else "ended")
            exit_text = (
                f"signal {a['signal']}"
                if a.get("signal")
                else (f"exit {a['exit_code']}" if a.get("exit_code") is not None else "")
            )
            steps = ""
            if a.get("resumed_from_step") is not None or a.get("step_reached") is not None:
                steps = f"  steps {a.get('resumed_from_step') or 0} -> {a.get('step_reached') if a.get('step_reached') is not None else '?'}"
            lines.append(
                f"    #{a['n']}  {clock(a['started_at'])}  {how:<12} {exit_text}{steps}"
                + (f"  gpus {a['gpus']}" if a.get("gpus") else "")
                + (f"  {a['where']}" if a.get("where") else "")
            )
    if d["checkpoints"]:
        lines.append("  checkpoints:")
        for c in d["checkpoints"]:
            lines.append(f"    {c['path']}  ({c['bytes'] / 1e6:.1f} MB)")
    auto = d.get("checkpoint_interval")
    if auto and auto.get("interval_s") is not None:
        lines.append(
            f"  checkpoint: every {duration(auto['interval_s'])} (auto: {auto.get('why')}; MTBF from "
            f"{auto.get('mtbf_source')})"
        )
    for name, run in sorted(((d.get("tracking") or {}).get("backends") or {}).items()):
        if isinstance(run, dict):
            where = "  ".join(str(run[k]) for k in ("project", "mode", "url") if run.get(k))
            lines.append(
                f"  tracker:   {name} run {run.get('run_id') or '-'}  {where}".rstrip()
                + (f"   WARNING not logging: {run['warning']}" if run.get("warning") else "")
            )
    memory = d.get("snapshot_memory") or {}
    if memory.get("background") is False:
        lines.append(f"  warning:   {memory.get('reason')}")
    if len(d.get("machines") or []) > 1:
        lines.append("  machines:")
        for mc in d["machines"]:
            first, last = mc.get("first_step"), mc.get("last_step")
            lines.append(
                f"    {mc.get('host') or '?'}  {mc.get('market') or '-':<9}  "
                + (f"{mc['zone']}  " if mc.get("zone") else "")
                + f"{clock(mc.get('from'))} - "
                f"{clock(mc.get('to'))}  steps {first if first is not None else '?'} -> "
                f"{last if last is not None else '?'}"
            )
    mirror = d.get("mirror")
    if mirror:
        lines.append(
            f"  mirror:    {mirror['url']}   step {mirror['step'] if mirror['step'] is not None else '-'}"
            f"   pending {mirror['pending']}   uploaded {clock(mirror.get('uploaded_at'))}"
            + (f"   mirror lagging {mirror['lag_s']:.0f}s" if _lagging(mirror) else "")
            + (f"   ERROR {mirror['error']}" if mirror.get("error") else "")
            + (f"   adopted by {mirror['lease_lost_to']}" if mirror.get("lease_lost_to") else "")
        )
    if d.get("result"):
        r = d["result"]
        best = r.get("best_metric")
        best = f"{r['best_monitor']}={best:.4g}" if r.get("best_monitor") and isinstance(best, (int, float)) else best
        lines.append(
            f"  result:    best {best}  steps {r.get('steps')}  epochs {r.get('epochs')}"
            f"{'  (early stopped)' if r.get('early_stopped') else ''}"
        )
    lines.append("  events:")
    for e in d["events"]:
        lines.append(f"    {clock(e['at'])}  {e['kind']:<16} {e['detail']}")
    return "\n".join(lines)


def lost_attempt_lines(attempts: list[dict[str, Any]]) -> list[str]:
    """An attempt that ended with no word (a SIGKILL, a lost machine) may have run past its last
    report: say what is known (the furthest step reported or checkpointed, the checkpoint the next
    attempt resumed from), never a count of steps lost that nobody could have measured."""
    out = []
    for i, a in enumerate(attempts):
        if a.get("outcome") != "lost":
            continue
        reached = a.get("step_reached")
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        resumed = (
            f"; attempt #{nxt['n']} resumed from the checkpoint at step {nxt['resumed_from_step']}"
            if nxt is not None and nxt.get("resumed_from_step") is not None
            else (f"; attempt #{nxt['n']} started from scratch (no checkpoint)" if nxt is not None else "")
        )
        out.append(
            f"  lost:      attempt #{a['n']} ended without a word (killed, or its machine lost): last step known "
            f"{reached if reached is not None else '?'}{resumed}; what it ran after its last report is unknown "
            "and not counted"
        )
    return out


def _lagging(mirror: dict[str, Any]) -> bool:
    """Behind by more than a stall, or the store down with a checkpoint waiting (views/mirror.py)."""
    from ..objectstore.stall import STALL_S

    lag = mirror.get("lag_s")
    return lag is not None and (lag >= STALL_S or bool(mirror.get("error")))
