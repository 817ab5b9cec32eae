"""How long `orch status` / `orch submit` take on a store of 10,000 jobs, as real subprocesses,
against `python -c pass` measured in the same run; and proof (sys.modules in a subprocess) that
none of these commands imports torch, lightning, transformers or datasets.

    python -m benchmarks.cli_latency [--jobs 10000] [--runs 9] [--keep DIR] [--submit-runs 5]

Then `orch submit` of the quickstart job, a built-in job with its pre-flight, with and without a
daemon (benchmarks/builtin_submit.py; `--submit-runs 0` skips it).
Goals: `orch status` on 10,000 jobs under 300 ms; the built-in submit with a daemon under 1.5 s.
Exits 1 if a heavy library is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.home.paths import Home
from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState
from orchestrator.store import Store

from .builtin_submit import measure, report
from .common import orch_exe

HEAVY = ("torch", "lightning", "pytorch_lightning", "transformers", "datasets")
GOAL_STATUS_S = 0.300

# Runs one `orch` command in-process and reports which heavy modules it pulled in (on stderr,
# after the command's own output, so the command behaves exactly as `orch` does).
PROBE = """
import json, sys
sys.argv = ["orch"] + json.loads(sys.argv[1])
from orchestrator.cli import main
try:
    main()
except SystemExit:
    pass
heavy = [m for m in %r if m in sys.modules]
sys.stderr.write("\\nHEAVY=" + json.dumps(heavy) + "\\n")
""" % (HEAVY,)


def fill(home: Home, n_jobs: int, seed: int = 7) -> dict[str, int]:
    """n_jobs through Store.submit and Store.transition, the same calls orch makes: ~2% queued,
    0.5% running (with progress.json), the rest finished in a mix of outcomes."""
    rng = random.Random(seed)
    store = Store(home.ensure().db)
    store.db.execute("PRAGMA synchronous=OFF")  # filling only; the commands measured use their own connection
    spec = {"name": "bench", "gpus": 0, "command": ["python", "train.py"], "workdir": "/tmp", "retries": 2}
    now = time.time() - 86400
    n_running = max(1, n_jobs // 200)
    n_queued = max(1, n_jobs // 50)
    counts: dict[str, int] = {}
    for i in range(n_jobs):
        t = now + i
        job = store.submit(
            name=f"bench-{i}",
            kind="command",
            gpus=rng.choice((0, 1, 2)),
            priority=rng.randint(0, 3),
            retries=2,
            spec=spec,
            spec_path="/tmp/job.toml",
            now=t,
        )
        left = n_jobs - i
        if left <= n_queued:
            state = JobState.QUEUED
        elif left <= n_queued + n_running:
            state = JobState.RUNNING
        else:
            state = rng.choices(
                [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED], weights=[80, 10, 7, 3]
            )[0]
        if state is not JobState.QUEUED:
            if state is JobState.CANCELLED and rng.random() < 0.5:
                store.transition(job.id, JobState.CANCELLED, EventKind.CANCELLED, t + 1)
            else:
                store.transition(
                    job.id,
                    JobState.RUNNING,
                    EventKind.STARTED,
                    t + 1,
                    updates={"attempt": 1, "started_at": t + 1},
                    begin_attempt=AttemptStart(1),
                )
                if state is not JobState.RUNNING:
                    store.transition(
                        job.id,
                        state,
                        EventKind(state.value),
                        t + 2,
                        updates={"finished_at": t + 2, "run_seconds": 1.0, "cost": 0.01},
                        end_attempt=AttemptEnd(t + 2, AttemptOutcome(state.value), exit_code=0),
                    )
                else:
                    run_dir = home.run_dir(job.id)
                    run_dir.mkdir(parents=True, exist_ok=True)
                    (run_dir / "progress.json").write_text(
                        json.dumps(
                            {
                                "step": 50,
                                "total_steps": 1000,
                                "epoch": 0,
                                "metrics": {},
                                "samples_per_s": 10.0,
                                "updated_at": time.time(),
                            }
                        )
                    )
        counts[state.value] = counts.get(state.value, 0) + 1
    store.close()
    return counts


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict[str, str], runs: int, cwd: Path) -> tuple[float, list[float], float]:
    """Median wall seconds of `argv` over `runs` runs (after one warm-up), all samples, and the
    median CPU seconds (user + system) the command used: on a busy machine the CPU time moves far
    less than the wall time, so it is the figure to compare across runs."""
    samples, cpu = [], []
    for i in range(runs + 1):
        c0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        dt, dc = time.perf_counter() - t0, _children_cpu() - c0
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr.decode()}")
        if i:
            samples.append(dt)
            cpu.append(dc)
    return statistics.median(samples), samples, statistics.median(cpu)


def heavy_imports(args: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    marker = [line for line in proc.stderr.splitlines() if line.startswith("HEAVY=")]
    if not marker:
        raise SystemExit(f"probe of orch {' '.join(args)} printed no module list:\n{proc.stderr}")
    return json.loads(marker[-1][len("HEAVY=") :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=9, help="timed runs per command (median reported; at least 7)")
    parser.add_argument("--keep", type=Path, default=None, help="fill (or reuse) this ORCH_HOME and keep it")
    parser.add_argument(
        "--submit-runs", type=int, default=5, help="alternated rounds of the built-in submit arms (0: skip them)"
    )
    opts = parser.parse_args()
    runs = max(7, opts.runs)

    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    try:
        root = opts.keep or tmp / "home"
        home = Home(root.resolve())
        if home.db.exists():
            store = Store(home.db)
            counts = {k.value: v for k, v in store.count_by_state().items()}
            store.close()
            print(f"reusing {home.db}: {sum(counts.values())} jobs")
        else:
            t0 = time.perf_counter()
            counts = fill(home, opts.jobs)
            print(
                f"filled {home.db} with {sum(counts.values())} jobs in {time.perf_counter() - t0:.1f}s: "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            )
        job_toml = tmp / "job.toml"
        job_toml.write_text('name = "bench-submit"\ngpus = 0\ncommand = ["python", "-c", "pass"]\n')

        # PYTHONDONTWRITEBYTECODE dropped: an installed orch has its bytecode; without it every run compiles
        env = {k: v for k, v in os.environ.items() if k not in ("ORCH_CONFIG", "PYTHONDONTWRITEBYTECODE")}
        env["ORCH_HOME"] = str(home.root)
        orch = orch_exe()
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "orch status": [orch, "status"],
            "orch status --json": [orch, "status", "--json"],
            "orch status --all --json": [orch, "status", "--all", "--json"],
            "orch submit job.toml": [orch, "submit", str(job_toml)],
        }
        results = {}
        for label, argv in commands.items():
            results[label] = timed(argv, env, runs, tmp)

        base = results["python -c pass"][0]
        base_cpu = results["python -c pass"][2]
        print(
            f"\n{'command':<28}{'median ms':>10}{'min ms':>9}{'max ms':>9}{'x python':>10}{'cpu ms':>9}"
            f"{'cpu x py':>10}   ({runs} runs each)"
        )
        for label, (median, samples, cpu) in results.items():
            print(
                f"{label:<28}{median * 1000:>10.0f}{min(samples) * 1000:>9.0f}{max(samples) * 1000:>9.0f}"
                f"{median / base:>10.1f}{cpu * 1000:>9.0f}{cpu / base_cpu:>10.1f}"
            )

        failures = []
        for args in (["status"], ["status", "--json"], ["status", "--all", "--json"], ["submit", str(job_toml)]):
            heavy = heavy_imports(args, env, tmp)
            if heavy:
                failures.append(f"orch {' '.join(args)} imported {', '.join(heavy)}")
        print(
            "\nheavy imports (torch, lightning, transformers, datasets): "
            + ("; ".join(failures) if failures else "none, in status, status --json, status --all --json, submit")
        )

        status_ms = results["orch status"][0] * 1000
        verdict = "under" if status_ms < GOAL_STATUS_S * 1000 else "OVER"
        print(
            f"orch status on {sum(counts.values())} jobs: {status_ms:.0f} ms, {verdict} the {GOAL_STATUS_S * 1000:.0f} ms goal"
        )
        if opts.submit_runs > 0:
            env.pop("ORCH_HOME", None)
            report(measure(orch, env, opts.submit_runs, tmp), opts.submit_runs)
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
