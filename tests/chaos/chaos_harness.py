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
from orchestrator.model.records import Job
from orchestrator.model.states import TRANSITIONS, JobState

ROWS, BATCH, EPOCHS = 256, 16, 3
STEPS_PER_EPOCH = ROWS // BATCH  # 16
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS  # 48
EVERY = 5  # periodic checkpoints: a kill loses at most a few steps
SLOW_STEP_S = 0.05  # the runner's per-step sleep: a window to act in
SLOW_SAVE_S = 0.25  # the runner's sleep inside a checkpoint write (the mid-write fault's window)
STALL_S = 180  # nothing moved for this long (no state change, no step): a hang, not a slow machine
KINDS = ("daemon_kill", "daemon_restart", "job_kill", "supervisor_kill", "notice", "kill_mid_checkpoint")


# -- the workload ---------------------------------------------------------------------------------


def build_workload(root: Path) -> dict[str, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    texts = [r["text"] for r in sentiment_rows(600, seed=1)]
    model = build_tiny_bert(root / "tiny-bert", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    train = write_jsonl(root / "train.jsonl", sentiment_rows(ROWS, seed=11))
    return {"model": model, "train": train, "hf_cache": root / "hf-cache"}


def job_file(workload: dict[str, Path], folder: Path, name: str, seed: int, workers: int, *, slow: bool) -> Path:
    """The job's spec. `slow` adds the test-only sleeps (per step, inside a checkpoint write) that
    give the faults their windows; they change no number the job computes, so a reference run,
    which nothing interrupts, goes without them."""
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
        },
    }
    if slow:
        spec["env"].update({"ORCH_FAULT_SLOW_STEP_S": str(SLOW_STEP_S), "ORCH_FAULT_SLOW_SAVE_S": str(SLOW_SAVE_S)})
    path = folder / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    return path


JOBS = (("alpha", 7, 0), ("beta", 8, 1), ("gamma", 9, 0))  # name, seed, data-loader workers


class ChaosHome(OrchHome):
    """An OrchHome whose daemons (so every supervisor, job and fork under them) carry TREE_VAR
    naming this home: the process watcher's proof that a process can never become one of its jobs."""

    def env(self) -> dict[str, str]:
        return {**super().env(), TREE_VAR: str(self.root)}


TREE_VAR = "ORCH_CHAOS_TREE"


def make_home(folder: Path, *, chaos: bool, cpu_slots: int = 2) -> OrchHome:
    folder.mkdir(parents=True)
    h = ChaosHome(
        folder, cpu_slots=cpu_slots, grace_seconds=30, retry_backoff_seconds=0.2, max_retry_backoff_seconds=1.0
    )
    config = h.root / "config.toml"
    extra = ["", "[pricing]", "instance_hour = 3.6"]
    if chaos:
        extra += ["", "[preemption]", 'sources = ["file"]', "poll_seconds = 0.2", 'on_notice = "wait"']
    config.write_text(config.read_text() + "\n".join(extra) + "\n")
    h.config = load_config(config, required=True)
    return h


def submit_all(h: OrchHome, workload: dict[str, Path], *, slow: bool = True) -> dict[str, int]:
    from orchestrator.jobs.lifecycle import submit_job
    from orchestrator.home.wake import poke

    ids = {}
    for name, seed, workers in JOBS:
        path = job_file(workload, h.jobs_dir, name, seed, workers, slow=slow)
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


class References:
    """The three jobs once, uninterrupted, under their own daemon. They start before the chaos and
    are collected after it: their processes fill the cores the chaos leaves idle (restarts, backoff,
    one job left running) instead of running first on their own. Three slots: all at once."""

    def __init__(self, folder: Path):
        self.h = make_home(folder, chaos=False, cpu_slots=len(JOBS))
        self.ids: dict[str, int] = {}
        self.weights: Optional[dict[str, dict[str, Any]]] = None
        self.cleaned = False

    def start(self, workload: dict[str, Path]) -> None:
        self.h.start_daemon()
        self.ids = submit_all(self.h, workload, slow=False)

    def collect(self, timeout: float = 600) -> dict[str, dict[str, Any]]:
        """Each job's exported weights, once all three succeeded in one attempt."""
        if self.weights is None:
            h = self.h
            wait_for(
                lambda: all(h.state(j).is_terminal for j in self.ids.values()),
                timeout,
                interval=0.2,
                what=lambda: f"the reference runs (daemon log: {h.log_tail()})",
            )
            for name, job_id in self.ids.items():
                job = h.job(job_id)
                assert job.state is JobState.SUCCEEDED and job.attempt == 1, (name, job.state, job.reason)
            self.weights = {name: exported_weights(h.run_dir(job_id)) for name, job_id in self.ids.items()}
            self.cleanup()
        return self.weights

    def cleanup(self) -> None:
        if not self.cleaned:
            self.cleaned = True
            self.h.cleanup()


# -- watching the processes -------------------------------------------------------------------------


class AttemptWatcher(threading.Thread):
    """Polls /proc for processes whose environment names a job of this home (ORCH_RUN_DIR under
    it) and records, per job, every moment more than one ORCH_ATTEMPT value was alive. The
    supervisor carries the job's environment too but holds nothing once the job is gone, so only
    the job's own processes count."""

    def __init__(self, runs: Path, interval: float = 0.02, tree: Optional[Path] = None):
        super().__init__(daemon=True, name="attempt-watcher")
        self.prefix = str(runs) + os.sep
        self.marker = b"ORCH_RUN_DIR=" + os.fsencode(self.prefix)  # a cheap first sieve of the environment
        # With `tree` (a ChaosHome's root), a process whose environment has neither the marker nor
        # TREE_VAR=tree is outside the home's daemons and stays so (a fork carries its parent's
        # environment until it execs, and only the daemons' tree execs jobs): it is not read again
        # while its pid stays listed. Linux hands pids out in a cycle (pid_max), so a pid listed in
        # two scans in a row is one process.
        self.tree = None if tree is None else f"\0{TREE_VAR}={tree}\0".encode()
        self.outside: set[str] = set()
        self.interval = interval
        self.stop_flag = threading.Event()
        self.overlaps: list[dict[str, Any]] = []
        self.seen: dict[str, set[str]] = {}
        self.first: dict[tuple[str, str], float] = {}  # (job, attempt) -> first / last time seen alive
        self.last: dict[tuple[str, str], float] = {}
        self.scans = 0

    def scan(self) -> dict[str, dict[str, list[int]]]:
        # Bare os calls, and no second look at a process outside the tree: reading every process's
        # environment through pathlib at each scan made the watcher a fifth of a core.
        alive: dict[str, dict[str, list[int]]] = {}
        listed = {entry for entry in os.listdir("/proc") if entry.isdigit()}
        self.outside &= listed
        for entry in listed - self.outside:
            raw = proc_file(entry, "environ")
            if raw is None or self.marker not in raw:
                # Unreadable: a kernel thread, another user's process, or gone. An empty environment
                # is no verdict: a process in the middle of an execve shows one.
                if self.tree is not None and (raw is None or (raw and self.tree not in b"\0" + raw)):
                    self.outside.add(entry)
                continue
            if b"ORCH_JOB_ID=" not in raw:
                continue
            stat, cmdline = proc_file(entry, "stat"), proc_file(entry, "cmdline")
            if stat is None or cmdline is None:
                continue
            if (
                stat[stat.rfind(b")") + 2 :].split()[0] in (b"Z", b"X")
                or b"orchestrator.executors.supervisor" in cmdline
            ):
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


def proc_file(pid: str, name: str) -> Optional[bytes]:
    """/proc/<pid>/<name> whole, or None once the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


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


def schedule(seed: int, extra: int = 1) -> list[Fault]:
    """Every kind once in a random order, then `extra` more of kinds drawn at random; gaps and targets
    from the seed too. The kinds come first so that every kind fires even when the jobs end before
    the extras do."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    kinds += [rng.choice(KINDS) for _ in range(extra)]
    return [Fault(kind, gap=rng.randint(2, 6), pick=rng.random()) for kind in kinds]


class Chaos:
    def __init__(self, h: OrchHome, ids: dict[str, int], faults: list[Fault], seed: int):
        self.h, self.ids, self.faults, self.seed = h, ids, faults, seed
        self.names = {v: k for k, v in ids.items()}
        self.first_step: dict[tuple[int, int], int] = {}  # (job, attempt) -> first step seen
        self.hit: set[tuple[int, int]] = set()  # attempts a fault already targeted: one fault each
        self.daemon = h.start_daemon()
        self.t0 = time.time()
        self.last_motion: tuple[Any, ...] = ()
        self.moved_at = self.looked_at = time.monotonic()

    # -- looking --------------------------------------------------------------------------------

    def advanced(self, job: Job) -> int:
        """Steps made by the job's current attempt so far (0 when it is not running)."""
        if job.state is not JobState.RUNNING or not job.attempt:
            return 0
        run_dir = self.h.run_dir(job.id)
        pids = read_json(run_dir / f"attempt-{job.attempt}.pid")
        progress = read_json(run_dir / "progress.json")
        if not pids or not progress or (progress.get("train_started_at") or 0) < pids["started_at"]:
            return 0
        first = self.first_step.setdefault((job.id, job.attempt), progress["step"])
        return progress["step"] - first

    def ready(self, fault: Fault, jobs: list[Job]) -> list[int]:
        return [j.id for j in jobs if (j.id, j.attempt) not in self.hit and self.advanced(j) >= fault.gap]

    def jobs(self) -> list[Job]:
        return [self.h.job(j) for j in self.ids.values()]

    def all_done(self, jobs: Optional[list[Job]] = None) -> bool:
        return all(j.state.is_terminal for j in (jobs or self.jobs()))

    def wait_all_done(self, stall: float = STALL_S) -> None:
        """After the last fault: until every job ends, failing only when nothing moves."""
        while True:
            jobs = self.jobs()
            if self.all_done(jobs):
                return
            if self.stalled(jobs, stall):
                raise AssertionError(
                    f"no job changed state or made a step for {stall:g}s (daemon log: {self.h.log_tail()})"
                )
            time.sleep(0.2)

    # -- firing ---------------------------------------------------------------------------------

    def motion(self, jobs: list[Job]) -> tuple[Any, ...]:
        """What changes while the chaos gets anywhere: each job's state, attempt and step."""
        steps = [(read_json(self.h.run_dir(j.id) / "progress.json") or {}).get("step") for j in jobs]
        return tuple((j.state, j.attempt, step) for j, step in zip(jobs, steps))

    def stalled(self, jobs: list[Job], stall: float) -> bool:
        """True once nothing has moved for `stall` seconds. A hang guard, not a time limit: a
        loaded machine slows every step but still makes them."""
        now = time.monotonic()
        if now - self.looked_at >= 1:  # once a second is plenty for a guard of minutes
            self.looked_at, motion = now, self.motion(jobs)
            if motion != self.last_motion:
                self.last_motion, self.moved_at = motion, now
        return now - self.moved_at > stall

    def run(self, stall: float = STALL_S) -> None:
        for fault in self.faults:
            while True:
                jobs = self.jobs()
                if self.all_done(jobs):
                    return
                if self.stalled(jobs, stall):
                    raise AssertionError(f"no job changed state or made a step for {stall:g}s")
                if self.daemon.poll() is not None:
                    raise AssertionError(f"the daemon died by itself: {self.h.daemon_output(self.daemon)[-2000:]}")
                candidates = self.ready(fault, jobs)
                if candidates:
                    target = candidates[int(fault.pick * len(candidates))]
                    if self.fire(fault, target):
                        break
                # progress.json changes every 0.2 s (ORCH_PROGRESS_EVERY_S); a checkpoint write lasts
                # at least SLOW_SAVE_S. Looking more often only takes CPU from the jobs.
                time.sleep(0.05)

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
