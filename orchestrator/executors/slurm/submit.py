"""The Slurm executor's sbatch, off the tick's lock: `start` writes the script and queues the
submit; the exchange (daemon/executor_io.py) runs `sbatch`, writes the handle beside the attempt
(attempt-<n>.submitted.json) and keeps it for the next refresh, which records it on the job row.
Until then the attempt is "not submitted yet": alive, not billed, and a stop asked meanwhile is
applied once its Slurm id is known (or the submit is dropped before it is sent).

Never twice: an sbatch that timed out is looked up by the job's name before anything is decided,
and an attempt recorded as submitting by a daemon that died (no queue here, no handle file) is
looked up by name too; only one Slurm does not know is lost."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ...contract import attempt_log, attempt_submitted, read_json, write_exit_record, write_json_atomic
from ...host.secret_file import remove_secret_file
from ...model.records import Job
from .commands import log
from .query import parse_sbatch

SUBMITTING = "SUBMITTING"  # our own word: queued for sbatch, not sent yet
SUBMITTED = "SUBMITTED"  # our own word for "sbatch accepted it, squeue has not shown it yet"

Key = tuple[int, int]  # (job id, attempt)


@dataclass
class Sbatch:
    argv: list[str]
    env: dict[str, str]
    run_dir: Path
    job_id: int
    attempt: int
    script: str


@dataclass
class Submits:
    """What passes between the tick and the exchange about sbatch, each under `mu`."""

    queued: dict[Key, Sbatch] = field(default_factory=dict)
    sending: set[Key] = field(default_factory=set)  # in the exchange's hands right now
    handles: dict[Key, dict[str, Any]] = field(default_factory=dict)  # submitted, not recorded yet
    unknown: set[Key] = field(default_factory=set)  # looked up by name: Slurm has no such job
    stop_asked: set[Key] = field(default_factory=set)  # stopped before its Slurm id was known
    mu: threading.Lock = field(default_factory=threading.Lock)


def key_of(job: Job) -> Key:
    return (job.id, job.attempt)


def note(run_dir: Path, attempt: int, text: str) -> None:
    with open(run_dir / attempt_log(attempt), "a", encoding="utf-8") as f:
        f.write(f"[orch] {text}\n")


def send(
    submits: Submits,
    run: Callable[..., Any],
    find_by_name: Callable[[int, int], Optional[str]],
    orphans: list[Job],
) -> None:
    """The exchange's part: every queued sbatch, then the attempts recorded as submitting that no
    queue here knows (a daemon that died meanwhile), looked up by name."""
    with submits.mu:
        batch = list(submits.queued.items())
        submits.queued.clear()
        submits.sending.update(k for k, _ in batch)
    for key, s in batch:
        r = run(s.argv, env=s.env, what="sbatch")
        job_id = parse_sbatch(r.stdout) if r is not None and r.returncode == 0 else None
        if r is None:  # sbatch timed out: the job may have been queued all the same; never run it twice
            job_id = find_by_name(s.job_id, s.attempt)
        if not job_id:
            why = (r.stderr or r.stdout).strip() if r is not None else "sbatch did not answer"
            note(s.run_dir, s.attempt, f"sbatch refused attempt {s.attempt}: {why}")
            remove_secret_file(s.run_dir, s.attempt)
            now = time.time()
            write_exit_record(s.run_dir, s.attempt, 127, None, now, now, slurm_state="NOT SUBMITTED")
            log.error("job %s: cannot start attempt %s: sbatch refused the job: %s", s.job_id, s.attempt, why)
        else:
            _record(submits, key, s.run_dir, job_id, s.script)
            log.info("job %s: attempt %s submitted as Slurm job %s", s.job_id, s.attempt, job_id)
        with submits.mu:
            submits.sending.discard(key)
    for job in orphans:
        sid = find_by_name(job.id, job.attempt)
        with submits.mu:
            if sid:
                submits.handles[key_of(job)] = {
                    "slurm_job_id": sid,
                    "submitted_at": time.time(),
                    "state": SUBMITTED,
                    "where": f"Slurm {sid}: adopted",
                }
            else:
                submits.unknown.add(key_of(job))


def _record(submits: Submits, key: Key, run_dir: Path, job_id: str, script: str) -> None:
    ref = {
        "slurm_job_id": job_id,
        "submitted_at": time.time(),
        "state": SUBMITTED,
        "where": f"Slurm {job_id}: submitted",
        "script": script,
    }
    write_json_atomic(run_dir / attempt_submitted(key[1]), ref)
    with submits.mu:
        submits.handles[key] = ref


def handle_on_disk(run_dir: Path, attempt: int) -> Optional[dict[str, Any]]:
    ref = read_json(run_dir / attempt_submitted(attempt))
    return ref if ref and ref.get("slurm_job_id") else None
