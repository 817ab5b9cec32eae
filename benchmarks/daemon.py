"""Benchmark the real daemon: submit-to-start latency, the gap between one job's exit and the
next queued job's start, how fast 200 trivial jobs drain, and the idle daemon's RSS and CPU.

    python -m benchmarks.daemon [--jobs 200] [--latency-n 20] [--gap-n 20] [--idle-s 30] [--tick 1.0]

Runs a real `orch daemon run` on a temp $ORCH_HOME with the default config (tick 1 s, one CPU
slot) except `gpus = []`; submits in-process (what `orch submit` does, without paying for a CLI
process per job). Times come from the store and from attempt-<n>.exit, written by each attempt's
supervisor: `started_at` there is when the job process was spawned. Exits 1 if a goal is missed.
Goals: gap < 0.5 s (median), idle RSS < 80 MB, idle CPU < 1 %, torch never loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from orchestrator.spec.config import load_config
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.home.paths import Home
from orchestrator.host.polling import poll
from orchestrator.contract import read_json
from orchestrator.model.states import JobState
from orchestrator.store import Store
from orchestrator.home.wake import poke

GOALS = {"gap_median_s": 0.5, "idle_rss_mb": 80.0, "idle_cpu_pct": 1.0}


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    value = poll(predicate, timeout, 0.005)  # fine-grained: the latencies measured are tens of ms
    if not value:
        raise SystemExit(f"timed out after {timeout:g}s waiting for {what}")
    return value


class Bench:
    def __init__(self, root: Path, tick: float, slots: int):
        self.root = root
        self.home = Home(root / "home").ensure()
        (self.home.root / "config.toml").write_text(
            f"[daemon]\ngpus = []\ntick_seconds = {tick}\ncpu_slots = {slots}\n"
        )
        self.config = load_config(self.home.root / "config.toml", required=True)
        self.store = Store(self.home.db)
        self.jobs = root / "jobs"
        self.jobs.mkdir()
        self.daemon: subprocess.Popen | None = None

    def start(self) -> int:
        out = open(self.root / "daemon.out", "wb")
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "--home", str(self.home.root), "daemon", "run"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        wait_for(
            lambda: self.home.log_file.exists() and "daemon started" in self.home.log_file.read_text(),
            30,
            "the daemon to start",
        )
        return self.daemon.pid

    def stop(self) -> None:
        if self.daemon and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                self.daemon.kill()

    def job_file(self, name: str, command: list[str]) -> Path:
        path = self.jobs / f"{name}.toml"
        if not path.exists():
            path.write_text(f'name = "{name}"\ngpus = 0\nretries = 0\ncommand = {json.dumps(command)}\n')
        return path

    def submit(self, name: str, command: list[str]) -> int:
        job = submit_job(
            self.store, self.config, self.home, self.job_file(name, command), now=time.time(), machine_gpus=0
        )
        poke(self.home.wake_socket)
        return job.id

    def done(self, job_id: int) -> bool:
        return self.store.get(job_id).state.is_terminal

    def exit_of(self, job_id: int) -> dict:
        return wait_for(lambda: read_json(self.home.run_dir(job_id) / "attempt-1.exit"), 30, f"job {job_id}'s exit")

    # -- measurements --------------------------------------------------------------------

    def latency(self, n: int) -> dict[str, float]:
        """Submit one job into an idle queue, wait for it; n times."""
        dispatch, spawn = [], []
        for _ in range(n):
            job_id = self.submit("latency", ["true"])
            wait_for(lambda: self.done(job_id), 30, f"latency job {job_id}")
            job = self.store.get(job_id)
            assert job.state is JobState.SUCCEEDED, (job.state, job.reason)
            started = self.store.attempts(job_id)[0].started_at
            dispatch.append(started - job.submitted_at)
            spawn.append(self.exit_of(job_id)["started_at"] - job.submitted_at)
        return {
            "submit_to_dispatch_median_s": statistics.median(dispatch),
            "submit_to_job_spawn_median_s": statistics.median(spawn),
            "submit_to_job_spawn_max_s": max(spawn),
        }

    def gap(self, n: int) -> dict[str, float]:
        """A chain of n short jobs queued behind each other in the single slot: from one's exit
        (its supervisor's ended_at) to the next one's dispatch and spawn."""
        ids = [self.submit("gap", ["sleep", "0.2"]) for _ in range(n)]
        wait_for(lambda: all(self.done(i) for i in ids), 60 + n, "the gap chain")
        to_dispatch, to_spawn = [], []
        for prev, nxt in zip(ids, ids[1:]):
            ended = self.exit_of(prev)["ended_at"]
            to_dispatch.append(self.store.attempts(nxt)[0].started_at - ended)
            to_spawn.append(self.exit_of(nxt)["started_at"] - ended)
        return {
            "gap_to_dispatch_median_s": statistics.median(to_dispatch),
            "gap_median_s": statistics.median(to_spawn),
            "gap_max_s": max(to_spawn),
        }

    def drain(self, n: int) -> dict[str, float]:
        t0 = time.time()
        ids = [self.submit("trivial", ["true"]) for _ in range(n)]
        submitted = time.time() - t0
        wait_for(
            lambda: all(self.done(i) for i in ids[-5:]) and all(self.done(i) for i in ids), 600, f"{n} jobs to drain"
        )
        elapsed = time.time() - t0
        failed = [i for i in ids if self.store.get(i).state is not JobState.SUCCEEDED]
        assert not failed, f"jobs did not succeed: {failed[:5]}"
        return {
            "drain_jobs": n,
            "drain_s": elapsed,
            "drain_jobs_per_s": n / elapsed,
            "submit_jobs_per_s": n / submitted,
        }

    def idle(self, pid: int, seconds: float) -> dict[str, float]:
        time.sleep(3)  # let the drain's last tick and the queue_drained notice pass
        hz = os.sysconf("SC_CLK_TCK")
        before, t0 = _cpu_ticks(pid), time.monotonic()
        time.sleep(seconds)
        after, t1 = _cpu_ticks(pid), time.monotonic()
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
        maps = Path(f"/proc/{pid}/maps").read_text()
        return {
            "idle_cpu_pct": 100.0 * (after - before) / hz / (t1 - t0),
            "idle_rss_mb": rss_kb / 1024,
            "idle_threads": int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:"))),
            "torch_loaded": "torch" in maps,
        }


def _cpu_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--latency-n", type=int, default=20)
    parser.add_argument("--gap-n", type=int, default=20)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--tick", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    bench = Bench(root, args.tick, args.slots)
    results: dict[str, Any] = {"tick_seconds": args.tick, "cpu_slots": args.slots}
    try:
        pid = bench.start()
        results.update(bench.latency(args.latency_n))
        results.update(bench.gap(args.gap_n))
        results.update(bench.drain(args.jobs))
        results.update(bench.idle(pid, args.idle_s))
    finally:
        bench.stop()
        bench.store.close()
        shutil.rmtree(root, ignore_errors=True)
    missed = [f"{k} = {results[k]:.3f} (goal < {goal:g})" for k, goal in GOALS.items() if results[k] >= goal]
    if results["torch_loaded"]:
        missed.append("the daemon loaded torch")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key:32s} {value:.4f}" if isinstance(value, float) else f"{key:32s} {value}")
    for line in missed:
        print(f"GOAL MISSED: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
