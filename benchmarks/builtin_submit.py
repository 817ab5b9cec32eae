"""`orch submit` of the quickstart job (a built-in job: its pre-flight included) beside a bare
`python -c pass`, arms alternated round by round after a warm-up round: without a daemon (the
one-shot pre-flight subprocess imports torch and transformers each time) and with one (its warm
pre-flight answers; jobs/preflight_server.py). Every submit holds its job (`--at` next year), so
the daemon starts nothing and the machine stays as idle as it was. Used by cli_latency.py:

    python -m benchmarks.cli_latency               # the status arms, then these
    python -m benchmarks.builtin_submit [--runs 5] # these alone

Goal (issue 36): under 1.5 s wall on an idle machine, pre-flight included."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from .common import orch_exe

GOAL_SUBMIT_S = 1.5


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def prepare_quickstart(folder: Path, env: dict[str, str], orch: str) -> Path:
    """`orch example quickstart` and its prepare.py (the data and the tiny BERT, no download)."""
    subprocess.run([orch, "example", "quickstart", str(folder)], env=env, check=True, capture_output=True)
    job = folder / "quickstart" / "job.toml"
    subprocess.run([sys.executable, str(job.parent / "prepare.py")], env=env, check=True, capture_output=True)
    return job


def _wait_for_warm_preflight(home: Path, timeout: float = 300.0) -> None:
    """The daemon's log says its warm pre-flight is ready (it imports torch and transformers first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ": ready on " in (home / "daemon.log").read_text():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the daemon's warm pre-flight was not ready after {timeout:.0f} s (see {home}/daemon.log)")


def measure(orch: str, env: dict[str, str], runs: int, work: Path) -> dict[str, tuple[float, list[float], float]]:
    """Median wall seconds, the samples and the median CPU seconds of each arm."""
    job = prepare_quickstart(work / "example", env, orch)
    hold = (datetime.now() + timedelta(days=365)).strftime("%Y-%m-%dT%H:%M")
    bare_home, daemon_home = work / "home-no-daemon", work / "home-daemon"
    arms = {
        "python -c pass": ([sys.executable, "-c", "pass"], bare_home),
        "orch submit quickstart, no daemon": ([orch, "submit", "--at", hold, str(job)], bare_home),
        "orch submit quickstart, daemon": ([orch, "submit", "--at", hold, str(job)], daemon_home),
    }
    daemon_env = {**env, "ORCH_HOME": str(daemon_home)}
    subprocess.run([orch, "daemon", "start"], env=daemon_env, check=True, capture_output=True)
    try:
        # the daemon starts its warm pre-flight at the first built-in submit it hears of
        subprocess.run(arms["orch submit quickstart, daemon"][0], env=daemon_env, capture_output=True, cwd=work)
        _wait_for_warm_preflight(daemon_home)
        wall: dict[str, list[float]] = {label: [] for label in arms}
        cpu: dict[str, list[float]] = {label: [] for label in arms}
        for round_no in range(runs + 1):  # round 0 warms the bytecode and the page cache
            for label, (argv, home) in arms.items():
                c0, t0 = _children_cpu(), time.perf_counter()
                proc = subprocess.run(argv, env={**env, "ORCH_HOME": str(home)}, capture_output=True, cwd=work)
                dt, dc = time.perf_counter() - t0, _children_cpu() - c0
                if proc.returncode != 0:
                    raise SystemExit(f"{label} exited {proc.returncode}:\n{proc.stderr.decode()}")
                if round_no:
                    wall[label].append(dt)
                    cpu[label].append(dc)
    finally:
        subprocess.run([orch, "daemon", "stop"], env=daemon_env, capture_output=True)
    return {label: (statistics.median(wall[label]), wall[label], statistics.median(cpu[label])) for label in arms}


def report(results: dict[str, tuple[float, list[float], float]], runs: int) -> bool:
    """Print the table; True when the warm submit meets the goal."""
    base, base_cpu = results["python -c pass"][0], results["python -c pass"][2]
    print(
        f"\n{'built-in submit (quickstart)':<36}{'median ms':>10}{'min ms':>9}{'max ms':>9}{'x python':>10}"
        f"{'cpu ms':>9}{'cpu x py':>10}   ({runs} rounds, arms alternated)"
    )
    for label, (median, samples, cpu) in results.items():
        print(
            f"{label:<36}{median * 1000:>10.0f}{min(samples) * 1000:>9.0f}{max(samples) * 1000:>9.0f}"
            f"{median / base:>10.1f}{cpu * 1000:>9.0f}{cpu / base_cpu:>10.1f}"
        )
    warm = results["orch submit quickstart, daemon"][0]
    verdict = "under" if warm < GOAL_SUBMIT_S else "OVER"
    print(f"orch submit of the quickstart with a daemon: {warm * 1000:.0f} ms, {verdict} the {GOAL_SUBMIT_S} s goal")
    return warm < GOAL_SUBMIT_S


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="alternated rounds (median reported)")
    opts = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_CONFIG", "PYTHONDONTWRITEBYTECODE", "ORCH_HOME")}
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    with tempfile.TemporaryDirectory(prefix="orch-bench-submit-") as tmp:
        report(measure(orch_exe(), env, max(1, opts.runs), Path(tmp)), max(1, opts.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
