"""Benchmarks of the Slurm executor on a REAL private Slurm (started here, like tests/slurm):

1. submit -> RUNNING: `orch submit` of a command job through the real daemon vs a bare `sbatch`
   of the same kind of script, in the same run, arms alternated, a warm-up trial first. Measured
   from the submit call to the moment squeue (polled every 20 ms by this script) says RUNNING,
   and for orch also until orch's own row shows it (its poll adds up to [slurm] poll_seconds).
2. requeue -> first resumed step: a built-in job (tiny BERT) preempted by a high-partition job:
   from attempt 1's exit record to attempt 2's first training step, split into orch's part
   (exit -> next sbatch), Slurm's (sbatch -> RUNNING) and the job's start-up (RUNNING -> step).
3. daemon CPU per poll while tracking 1,000 Slurm jobs: 1,000 real held Slurm jobs and 1,000
   running orch jobs that point at them; CPU seconds of `Daemon.tick()` with a poll every tick
   (this process's CPU plus the squeue it runs, from getrusage), median over the polls.

Run: `python -m benchmarks.slurm [--trials 5] [--jobs 1000] [--skip-requeue]` as root with the
Debian packages of scripts/system-deps.d/slurm.sh installed."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.host.polling import poll
from tests.slurm.slurm_cluster import SlurmCluster, why_unusable


def wait(pred, timeout=120.0, interval=0.02, what=""):
    value = poll(pred, timeout, interval)
    if not value:
        raise TimeoutError(what)
    return value


def squeue_state(c: SlurmCluster, sid: str) -> str:
    return c.run("squeue", "-h", "-t", "all", "-j", sid, "-o", "%T", check=False).stdout.strip()


def make_home(tmp: Path, c: SlurmCluster, poll: float):
    from orchestrator.spec.config import load_config
    from tests.daemon_harness import OrchHome

    h = OrchHome(tmp, cpu_slots=4, grace_seconds=20, tick_seconds=0.2)
    text = (h.root / "config.toml").read_text()
    text += (
        '\n[executor]\nkind = "slurm"\n\n[slurm]\n' + f'slurm_conf = "{c.conf}"\npoll_seconds = {poll}\n'
        f'partition = "low"\nwarn_before = 0\nshared_dirs = ["{tmp}"]\n'
    )
    (h.root / "config.toml").write_text(text)
    h.config = load_config(h.root / "config.toml", required=True)
    return h


# -- 1. submit -> RUNNING ----------------------------------------------------------------------------


def bench_submit(c: SlurmCluster, tmp: Path, trials: int) -> dict:
    from orchestrator.jobs.lifecycle import cancel_job
    from orchestrator.model.states import JobState
    from orchestrator.home.wake import poke

    h = make_home(tmp / "submit", c, poll=1.0)
    h.start_daemon()
    script = tmp / "bare.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --partition=low\n#SBATCH --no-requeue\n#SBATCH --open-mode=append\n"
        f"#SBATCH --output={tmp}/bare-%j.log\nexec sleep 300\n"
    )
    orch_sq, orch_row, bare = [], [], []
    try:
        for trial in range(trials + 1):  # trial 0: warm-up, not counted
            for arm in ("orch", "bare") if trial % 2 == 0 else ("bare", "orch"):
                if arm == "bare":
                    t0 = time.perf_counter()
                    sid = c.run("sbatch", "--parsable", str(script)).stdout.strip()
                    wait(lambda: squeue_state(c, sid) == "RUNNING", what="bare RUNNING")
                    took = time.perf_counter() - t0
                    c.run("scancel", sid, check=False)
                    wait(lambda: squeue_state(c, sid) not in ("RUNNING", "COMPLETING"), what="bare gone")
                    if trial:
                        bare.append(took)
                else:
                    t0 = time.perf_counter()
                    job = h.submit(f"s{trial}", hold="never")
                    sid = wait(lambda: h.job(job).executor_ref.get("slurm_job_id"), what="orch sbatch")
                    wait(lambda: squeue_state(c, sid) == "RUNNING", what="orch RUNNING")
                    t_sq = time.perf_counter() - t0
                    wait(lambda: "RUNNING" in (h.job(job).executor_ref.get("where") or ""), what="orch row")
                    t_row = time.perf_counter() - t0
                    cancel_job(h.store, h.config, h.home, job, time.time())
                    poke(h.home.wake_socket)
                    h.wait_state(job, JobState.CANCELLED, timeout=60)
                    wait(lambda: squeue_state(c, sid) not in ("RUNNING", "COMPLETING"), what="orch gone")
                    if trial:
                        orch_sq.append(t_sq)
                        orch_row.append(t_row)
    finally:
        h.cleanup()
    med = statistics.median
    return {
        "trials": trials,
        "bare_sbatch_to_running_s": [round(x, 3) for x in bare],
        "orch_submit_to_running_s": [round(x, 3) for x in orch_sq],
        "orch_submit_to_status_running_s": [round(x, 3) for x in orch_row],
        "median_bare_s": round(med(bare), 3),
        "median_orch_s": round(med(orch_sq), 3),
        "median_orch_status_s": round(med(orch_row), 3),
        "ratio_orch_over_bare": round(med(orch_sq) / med(bare), 2),
    }


# -- 2. requeue -> first resumed step ------------------------------------------------------------------


def bench_requeue(c: SlurmCluster, tmp: Path, trials: int) -> dict:
    import tomli_w

    from orchestrator.contract import read_json
    from orchestrator.jobs.lifecycle import submit_job
    from orchestrator.model.states import JobState
    from orchestrator.home.wake import poke
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    data = tmp / "bert"
    model = build_tiny_bert(
        data / "model",
        [r["text"] for r in sentiment_rows(500, seed=1)],
        hidden=32,
        layers=2,
        heads=2,
        vocab_size=300,
        max_positions=64,
    )
    train = write_jsonl(data / "train.jsonl", sentiment_rows(1600, seed=11))
    h = make_home(tmp / "requeue", c, poll=0.5)
    h.start_daemon()
    rows = []
    try:
        for trial in range(trials):
            spec = {
                "name": f"rq{trial}",
                "gpus": 0,
                "retries": 0,
                "model": {"name_or_path": str(model), "num_labels": 2},
                "data": {"train": str(train), "max_length": 32, "num_workers": 0},
                "train": {"max_epochs": 2, "batch_size": 16, "precision": "32", "seed": 7},
                "checkpoint": {"every_n_steps": 50},
                "env": {
                    "OMP_NUM_THREADS": "1",
                    "ORCH_PROGRESS_EVERY_S": "0.2",
                    "HF_HUB_OFFLINE": "1",
                    "ORCH_FAULT_SLOW_STEP_S": "0.05",
                },
            }
            path = h.jobs_dir / f"rq{trial}.toml"
            path.write_bytes(tomli_w.dumps(spec).encode())
            job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=64).id
            poke(h.home.wake_socket)
            run = h.run_dir(job)
            wait(lambda: ((read_json(run / "progress.json") or {}).get("step") or 0) >= 20, 180, 0.1, "step 20")
            node = h.job(job).executor_ref.get("nodes", ["n1"])[0]
            c.run("sbatch", "--parsable", "-o", "/dev/null", "-p", "high", "-w", node, "--wrap", "sleep 1")
            wait(lambda: (run / "attempt-2.slurm.json").exists(), 180, 0.05, "attempt 2 on a node")
            first = wait(
                lambda: (
                    (read_json(run / "progress.json") or {}).get("first_step_at")
                    if (read_json(run / "progress.json") or {}).get("train_started_at", 0)
                    > read_json(run / "attempt-2.slurm.json")["started_at"]
                    else None
                ),
                180,
                0.05,
                "first step",
            )
            exit1 = read_json(run / "attempt-1.exit")
            sub2 = read_json(run / "attempt-2.submitted.json")
            info2 = read_json(run / "attempt-2.slurm.json")
            rows.append(
                {
                    "exit_to_resubmit_s": round(sub2["submitted_at"] - exit1["ended_at"], 3),
                    "resubmit_to_running_s": round(info2["started_at"] - sub2["submitted_at"], 3),
                    "running_to_first_step_s": round(first - info2["started_at"], 3),
                    "exit_to_first_resumed_step_s": round(first - exit1["ended_at"], 3),
                }
            )
            h.wait_state(job, JobState.SUCCEEDED, timeout=240)
    finally:
        h.cleanup()
    return {
        "trials": rows,
        "median_exit_to_first_resumed_step_s": statistics.median(r["exit_to_first_resumed_step_s"] for r in rows),
    }


# -- 3. daemon CPU per poll, 1,000 tracked jobs ---------------------------------------------------------


def bench_poll_cpu(c: SlurmCluster, tmp: Path, n: int, polls: int) -> dict:
    from orchestrator.jobs.attempts import begin_attempt
    from orchestrator.spec.config import load_config
    from orchestrator.daemon.tick import Daemon
    from orchestrator.jobs.lifecycle import submit_job
    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    root = tmp / "poll"
    home = Home(root / "home").ensure()
    (home.root / "config.toml").write_text(
        f'[daemon]\ncpu_slots = {n + 10}\ngpus = []\n[executor]\nkind = "slurm"\n[slurm]\nslurm_conf = "{c.conf}"\n'
        f'poll_seconds = 0.001\nshared_dirs = ["{root}"]\n'
    )
    config = load_config(home.root / "config.toml", required=True)
    store = Store(home.db)
    t0 = time.perf_counter()
    ids = []
    wrap = root / "held.sh"
    wrap.write_text("#!/bin/bash\ntrue\n")
    for _ in range(n):
        ids.append(c.run("sbatch", "--parsable", "--hold", "-p", "low", "-o", "/dev/null", str(wrap)).stdout.strip())
    submit_s = time.perf_counter() - t0
    jf = root / "job.toml"
    jf.write_text('name = "p"\ngpus = 0\ncommand = ["true"]\n')
    now = time.time()
    for sid in ids:
        job = submit_job(store, config, home, jf, now=now, machine_gpus=0)
        begin_attempt(store, config, home, job, [], now, environ={}, executor="slurm")
        store.update(job.id, now, executor_ref={"slurm_job_id": sid, "submitted_at": now - 60})
    d = Daemon(home, config, store, environ={})
    d.tick()  # the first poll writes every job's "where" once
    cpu, wall = [], []
    for _ in range(polls):
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        d.tick()
        w1 = time.perf_counter()
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(
            (
                self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime,
                kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime,
            )
        )
        wall.append(w1 - w0)
    # the executor's share: refresh with a squeue, and refresh between polls (exit records only)
    from orchestrator.model.states import JobState

    running = store.jobs([JobState.RUNNING])
    ex = d.executor
    ref_poll, ref_idle = [], []
    for _ in range(polls):
        ex.cache.polled_at = 0.0
        a = resource.getrusage(resource.RUSAGE_SELF)
        ex.refresh(running, time.time())
        ex.cache.polled_at = time.time() + 3600  # "just polled": the next refresh only reads exit records
        b = resource.getrusage(resource.RUSAGE_SELF)
        ex.refresh(running, time.time())
        e = resource.getrusage(resource.RUSAGE_SELF)
        ref_poll.append(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime)
        ref_idle.append(e.ru_utime + e.ru_stime - b.ru_utime - b.ru_stime)
    c.run("scancel", *ids[:1], check=False)
    c.cancel_all(120)
    med = statistics.median
    return {
        "tracked_jobs": n,
        "polls": polls,
        "sbatch_1000_s": round(submit_s, 1),
        "median_executor_refresh_cpu_s_with_squeue": round(med(ref_poll), 4),
        "median_executor_refresh_cpu_s_between_polls": round(med(ref_idle), 4),
        "median_daemon_cpu_s_per_poll": round(med(x[0] for x in cpu), 4),
        "median_squeue_cpu_s_per_poll": round(med(x[1] for x in cpu), 4),
        "median_tick_wall_s": round(med(wall), 4),
        "squeue_calls": d.executor.configured.queries.get("squeue"),
        "sacct_calls": d.executor.configured.queries.get("sacct"),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--requeue-trials", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--polls", type=int, default=10)
    ap.add_argument("--skip-requeue", action="store_true")
    ap.add_argument("--skip-submit", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    why = why_unusable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = Path(tempfile.mkdtemp(prefix="orch-slurm-bench-"))
    os.chmod(tmp, 0o755)
    c = SlurmCluster(grace=15).start()
    out = {}
    try:
        if not args.skip_submit:
            out["submit_to_running"] = bench_submit(c, tmp, args.trials)
            print(json.dumps(out["submit_to_running"], indent=1), flush=True)
        if not args.skip_requeue:
            out["requeue_to_first_resumed_step"] = bench_requeue(c, tmp, args.requeue_trials)
            print(json.dumps(out["requeue_to_first_resumed_step"], indent=1), flush=True)
        out["poll_cpu"] = bench_poll_cpu(c, tmp, args.jobs, args.polls)
        print(json.dumps(out["poll_cpu"], indent=1), flush=True)
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(c.base, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
