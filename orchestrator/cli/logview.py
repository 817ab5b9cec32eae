"""`orch logs`: a job's attempt logs oldest first; `-f` follows into new attempts until the job
ends, so one command shows a run across preemptions and retries."""

from __future__ import annotations

import sys
import time
from collections import deque
from pathlib import Path
from typing import Optional

from ..contract import parse_attempt_log
from ..home.paths import Home
from ..store import Store


def attempt_logs(run_dir: Path) -> list[Path]:
    """Every attempt's log, oldest attempt first; within one, rank 0 then the other ranks' (a
    multi-node job under Slurm writes one per rank)."""
    found = []
    if run_dir.is_dir():
        for p in run_dir.iterdir():
            parsed = parse_attempt_log(p.name)
            if parsed:
                found.append((parsed, p))
    return [p for _, p in sorted(found)]


def _labelled(path: Path, text: str) -> str:
    """Another rank's lines carry its rank, so interleaved output stays readable."""
    parsed = parse_attempt_log(path.name)
    if not parsed or not parsed[1] or not text:
        return text
    prefix = f"[rank {parsed[1]}] "
    return "".join(prefix + line for line in text.splitlines(keepends=True))


def print_logs(
    store: Store,
    home: Home,
    job_id: int,
    *,
    follow: bool = False,
    last: Optional[int] = None,
    poll_s: float = 0.25,
    out=None,
) -> int:
    out = out or sys.stdout
    job = store.get(job_id)  # JobNotFound for a bad id
    run_dir = home.run_dir(job_id)
    logs = attempt_logs(run_dir)
    if not logs and not follow:
        print(f"job {job_id} ({job.name}) has no log yet: it is {job.state.value}", file=sys.stderr)
        return 0
    if last is not None:
        lines: deque[str] = deque(maxlen=last)
        for p in logs:
            with p.open(errors="replace") as f:
                lines.extend(_labelled(p, f.read()).splitlines(keepends=True))
        out.write("".join(lines))
        positions = {p: p.stat().st_size for p in logs}
    else:
        positions = {}
        for p in logs:
            with p.open(errors="replace") as f:
                out.write(_labelled(p, f.read()))
                positions[p] = f.tell()
    out.flush()
    if not follow:
        return 0
    try:
        while True:
            state = store.get(job_id).state
            for p in attempt_logs(run_dir):
                with p.open(errors="replace") as f:
                    f.seek(positions.get(p, 0))
                    chunk = f.read()
                    positions[p] = f.tell()
                if chunk:
                    out.write(_labelled(p, chunk))
                    out.flush()
            if state.is_terminal:
                return 0
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return 0
