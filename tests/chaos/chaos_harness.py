"""The chaos harness: a seeded schedule of faults thrown at a real daemon running real built-in
jobs, a watcher of the job PROCESSES (not the records) that notices two attempts of one job alive
at once, and the checks made afterwards (weights, events, cost ledger).

Faults are spaced by training progress (a job must have made N steps in its current attempt),
never by fixed sleeps, so a slow machine changes the timing but not the story. The schedule is a
pure function of the seed: ORCH_CHAOS_SEED=N replays the same fault kinds, order, gaps and target
picks (a fraction mapped onto the jobs ready at that moment, so which job it hits can differ when
the machine's speed changes which jobs are running)."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import tomli_w
from daemon_harness import OrchHome, wait_for

from orchestrator.spec.config import load_config
from orchestrator.contract import TEMP_MARK, read_json
from orchestrator.host.procs import is_alive
from orchestrator.model.states import TRANSITIONS, JobState

ROWS, BATCH, EPOCHS = 256, 16, 3
STEPS_PER_EPOCH = ROWS // BATCH  # 16
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS  # 48
EVERY = 5  # periodic checkpoints: a kill loses at most a few steps
SLOW_STEP_S = 0.05  # the runner's per-step sleep: a window to act in
SLOW_SAVE_S = 0.25  # the runner's sleep inside a checkpoint write (the mid-write fault's window)
KINDS = ("daemon_kill", "daemon_restart", "job_kill", "supervisor_kill", "notice", "kill_mid_checkpoint")


# -- the workload ---------------------------------------------------------------------------------


def build_workload(root: Path) -> dict[str, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    texts = [r["text"] for r in sentiment_rows(600, seed=1)]
    model = build_tiny_bert(root / "tiny-bert", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    train = write_jsonl(root / "train.jsonl", sentiment_rows(ROWS, seed=11))
    return {"model": model, "train": train, "hf_cache": root / "hf-cache"}


def job_file(workload: dict[str, Path], folder: Path, name: str, seed: int, workers: int) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "gpus": 0,
        "retries": 40,
        "grace_seconds": 30,
        "model": {"name_or_path": str(workload["model"]), "num_labels": 2},
        "data": {"train": str(workload["train"]), "max_length": 32, "num_workers": workers, "shuffle": True},
        "train": {"max_epochs": EPOCHS, "batch_size": BATCH, "precision": "32", "learning_rate": 1e-3, "seed": seed},
        "checkpoint": {"every_n_steps": EVERY, "keep": 2},
        "env": {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(workload["hf_cache"]),
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": "0.2",
            "ORCH_FAULT_SLOW_STEP_S": str(SLOW_STEP_S),
            "ORCH_FAULT_SLOW_SAVE_S": str(SLOW_SAVE_S),
        },
    }
    path = folder / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    return path


JOBS = (("alpha", 7, 0), ("beta", 8, 1), ("gamma", 9, 0))  # name, seed, data-loader workers


def make_home(folder: Path, *, chaos: bool) -> OrchHome:
    folder.mkdir(parents=True)
    h = OrchHome(folder, cpu_slots=2, grace_seconds=30, retry_backoff_seconds=0.2, max_retry_backoff_seconds=1.0)
    config = h.root / "config.toml"
    extra = ["", "[pricing]", "instance_hour = 3.6"]
    if chaos:
        extra += ["", "[preemption]", 'sources = ["file"]', "poll_seconds = 0.2", 'on_notice = "wait"']
    config.write_text(config.read_text() + "\n".join(extra) + "\n")
    h.config = load_config(config, required=True)
    return h


def submit_all(h: OrchHome, workload: dict[str, Path]) -> dict[str, int]:
    from orchestrator.jobs.lifecycle import submit_job
    from orchestrator.home.wake import poke

    ids = {}
    for name, seed, workers in JOBS:
        path = job_file(workload, h.jobs_dir, name, seed, workers)
        ids[name] = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0).id
    poke(h.home.wake_socket)
    return ids


def exported_weights(run_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(run_dir / "model"))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def differing_tensors(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    import torch

    if expected.keys() != got.keys():
        return sorted(set(expected) ^ set(got))
    return [k for k in expected if not torch.equal(expected[k], got[k])]


# -- watching the processes -------------------------------------------------------------------------


class AttemptWatcher(threading.Thread):
    """Polls /proc for processes whose environment names a job of this home (ORCH_RUN_DIR under
    it) and records, per job, every moment more than one ORCH_ATTEMPT value was alive. The
    supervisor carries the job's environment too but holds nothing once the job is gone, so only
    the job's own processes count."""

    def __init__(self, runs: Path, interval: float = 0.02):
        super().__init__(daemon=True, name="attempt-watcher")
        self.prefix = str(runs) + os.sep
        self.interval = interval
        self.stop_flag = threading.Event()
        self.overlaps: list[dict[str, Any]] = []
        self.seen: dict[str, set[str]] = {}
        self.first: dict[tuple[str, str], float] = {}  # (job, attempt) -> first / last time seen alive
        self.last: dict[tuple[str, str], float] = {}
        self.scans = 0

    def scan(self) -> dict[str, dict[str, list[int]]]:
        alive: dict[str, dict[str, list[int]]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                raw = Path(f"/proc/{entry}/environ").read_bytes()
                if b"ORCH_JOB_ID=" not in raw:
                    continue
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X") or b"orchestrator.executors.supervisor" in cmdline:
                continue
            env = dict(part.split(b"=", 1) for part in raw.split(b"\0") if b"=" in part)
            run_dir = env.get(b"ORCH_RUN_DIR", b"").decode(errors="replace")
            if not run_dir.startswith(self.prefix):
                continue
            job = env[b"ORCH_JOB_ID"].decode()
            attempt = env.get(b"ORCH_ATTEMPT", b"?").decode()
            alive.setdefault(job, {}).setdefault(attempt, []).append(int(entry))
        return alive

    def run(self) -> None:
        while not self.stop_flag.is_set():
            now = time.time()
            for job, attempts in self.scan().items():
                self.seen.setdefault(job, set()).update(attempts)
                for attempt in attempts:
                    self.first.setdefault((job, attempt), now)
                    self.last[(job, attempt)] = now
                if len(attempts) > 1:
                    self.overlaps.append({"t": time.time(), "job": job, "attempts": attempts})
            self.scans += 1
            time.sleep(self.interval)

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(5)

    def handovers(self) -> list[float]:
        """Seconds between the last sight of an attempt's processes and the first of the next one's
        (the watcher's polling interval bounds the precision)."""
        gaps = []
        for (job, attempt), first in self.first.items():
            prev = (job, str(int(attempt) - 1)) if attempt.isdigit() else None
            if prev in self.last:
                gaps.append(first - self.last[prev])
        return sorted(gaps)


# -- the schedule -------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    gap: int  # steps the target must make in its current attempt before this fault fires
    pick: float  # which running job (a fraction, mapped onto the ones running then)
    fired_at: Optional[float] = None
    target: Optional[str] = None
    note: str = ""

    def line(self, t0: float) -> str:
        when = f"t+{self.fired_at - t0:6.1f}s" if self.fired_at else "not fired"
        return f"{when}  {self.kind:<20} target={self.target or '-':<6} gap={self.gap}  {self.note}"


def schedule(seed: int, count: int = 12) -> list[Fault]:
    """Every kind at least once, the rest drawn at random; order, gaps and targets from the seed."""
    rng = random.Random(seed)
    kinds = list(KINDS) + [rng.choice(KINDS) for _ in range(count - len(KINDS))]
    rng.shuffle(kinds)
    return [Fault(kind, gap=rng.randint(2, 6), pick=rng.random()) for kind in kinds]


class Chaos:
    def __init__(self, h: OrchHome, ids: dict[str, int], faults: list[Fault], seed: int):
        self.h, self.ids, self.faults, self.seed = h, ids, faults, seed
        self.names = {v: k for k, v in ids.items()}
        self.first_step: dict[tuple[int, int], int] = {}  # (job, attempt) -> first step seen
        self.hit: set[tuple[int, int]] = set()  # attempts a fault already targeted: one fault each
        self.daemon = h.start_daemon()
        self.t0 = time.time()

    # -- looking --------------------------------------------------------------------------------

    def advanced(self, job_id: int) -> int:
        """Steps made by the job's current attempt so far (0 when it is not running)."""
        job = self.h.job(job_id)
        if job.state is not JobState.RUNNING or not job.attempt:
            return 0
        run_dir = self.h.run_dir(job_id)
        pids = read_json(run_dir / f"attempt-{job.attempt}.pid")
        progress = read_json(run_dir / "progress.json")
        if not pids or not progress or (progress.get("train_started_at") or 0) < pids["started_at"]:
            return 0
        first = self.first_step.setdefault((job_id, job.attempt), progress["step"])
        return progress["step"] - first

    def ready(self, fault: Fault) -> list[int]:
        return [
            j for j in self.ids.values() if (j, self.h.job(j).attempt) not in self.hit and self.advanced(j) >= fault.gap
        ]

    def all_done(self) -> bool:
        return all(self.h.state(j).is_terminal for j in self.ids.values())

    # -- firing ---------------------------------------------------------------------------------

    def run(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for fault in self.faults:
            while True:
                if self.all_done():
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the faults did not all fire within {timeout:g}s")
                if self.daemon.poll() is not None:
                    raise AssertionError(f"the daemon died by itself: {self.h.daemon_output(self.daemon)[-2000:]}")
                candidates = self.ready(fault)
                if candidates:
                    target = candidates[int(fault.pick * len(candidates))]
                    if self.fire(fault, target):
                        break
                time.sleep(0.01)

    def fire(self, fault: Fault, job_id: int) -> bool:
        h, job = self.h, self.h.job(job_id)
        run_dir = h.run_dir(job_id)
        pids = read_json(run_dir / f"attempt-{job.attempt}.pid") or {}
        fault.target = self.names[job_id]
        kind = fault.kind
        if kind == "kill_mid_checkpoint":
            temps = [p.name for p in (run_dir / "checkpoints").glob(f"{TEMP_MARK}*")]
            if not temps or not is_alive(pids.get("job_pid"), pids.get("job_start")):
                return False  # wait for a write in progress
            os.killpg(pids["job_pid"], signal.SIGKILL)
            fault.note = f"attempt {job.attempt}: SIGKILL while {temps[0]} was being written"
        elif kind == "job_kill":
            if not is_alive(pids.get("job_pid"), pids.get("job_start")):
                return False
            os.killpg(pids["job_pid"], signal.SIGKILL)
            fault.note = f"attempt {job.attempt}: SIGKILL of the job's process group"
        elif kind == "supervisor_kill":
            if not is_alive(pids.get("supervisor_pid"), pids.get("supervisor_start")):
                return False
            os.kill(pids["supervisor_pid"], signal.SIGKILL)
            fault.note = f"attempt {job.attempt}: SIGKILL of supervisor {pids['supervisor_pid']}"
        elif kind == "daemon_kill":
            h.kill9(self.daemon)
            fault.note = f"SIGKILL of daemon {self.daemon.pid}; a new one started"
            self.daemon = h.start_daemon()
        elif kind == "daemon_restart":
            old = self.daemon.pid
            code = h.stop_daemon(self.daemon, timeout=90)
            fault.note = f"SIGTERM of daemon {old} (exit {code}); a new one started"
            self.daemon = h.start_daemon()
        elif kind == "notice":
            sentinel = h.root / "preempt-notice"
            sentinel.touch()
            try:
                wait_for(
                    lambda: not any(self.h.state(j) is JobState.RUNNING for j in self.ids.values()),
                    90,
                    interval=0.05,
                    what="every job to checkpoint and wait under the notice",
                )
            finally:
                sentinel.unlink()
            fault.note = "preemption notice raised; cleared once no job ran"
        fault.fired_at = time.time()
        self.hit.add((job_id, job.attempt))
        return True

    def history(self) -> str:
        return "\n".join(f"  {f.line(self.t0)}" for f in self.faults)


# -- the checks afterwards ----------------------------------------------------------------------------

EVENT_STATE = {
    "submitted": JobState.QUEUED,
    "started": JobState.RUNNING,
    "resumed": JobState.RUNNING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
    "retrying": JobState.QUEUED,
    "preempted": JobState.QUEUED,
    "oom": JobState.QUEUED,
    "stopped": JobState.STOPPED,
    "cancelled": JobState.CANCELLED,
}


def event_problems(h: OrchHome, job_id: int) -> list[str]:
    """Replay the job's events through the transition table: each state change must be there,
    in an allowed order, one start per attempt row, ending where the job is."""
    problems = []
    state: Optional[JobState] = None
    starts = 0
    for event in h.store.events(job_id):
        dst = EVENT_STATE.get(event.kind)
        if dst is None:
            continue
        if event.kind == "failed" and state is JobState.QUEUED:
            problems.append(f"event {event.id}: failed while queued")
        if state is not None and dst not in TRANSITIONS[state] and not (state is dst is JobState.QUEUED):
            problems.append(f"event {event.id} {event.kind}: {state.value} -> {dst.value} is not allowed")
        starts += dst is JobState.RUNNING
        state = dst
    job = h.job(job_id)
    attempts = h.store.attempts(job_id)
    if state is not job.state:
        problems.append(f"the events end in {state} but the job is {job.state.value}")
    if starts != len(attempts) or starts != job.attempt:
        problems.append(f"{starts} start events, {len(attempts)} attempt rows, attempt counter {job.attempt}")
    unended = [a.n for a in attempts if a.ended_at is None]
    if unended:
        problems.append(f"attempts {unended} never ended")
    return problems


def ledger_problem(h: OrchHome) -> Optional[str]:
    jobs = sum(j.cost for j in h.store.jobs())
    ledger = h.store.ledger()
    machine = ledger.get("uptime_s", 0.0) * h.config.pricing.instance_hour / 3600
    got = jobs + ledger.get("idle_cost", 0.0)
    if machine <= 0 or abs(got - machine) > 1e-9 * max(1.0, machine):
        return f"jobs {jobs!r} + idle {ledger.get('idle_cost')!r} = {got!r}, but uptime x rate = {machine!r}"
    return None


def summary(h: OrchHome, ids: dict[str, int]) -> str:
    lines = []
    for name, job_id in ids.items():
        job = h.job(job_id)
        outcomes = [str(a.outcome) for a in h.store.attempts(job_id)]
        lines.append(f"  {name}: {job.state.value} after {job.attempt} attempts {outcomes}; {job.reason}")
    return "\n".join(lines)


def dump_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))
