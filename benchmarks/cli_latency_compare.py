"""`orch status` before and after a change, in the same run: CPU time (user + system) of each
command from two source trees, alternated round by round (which tree goes first swaps each
round), with a bare `python -c pass` measured between them; medians and ratios to that bare
start. The store is cli_latency.py's (10,000 jobs, 50 recorded running, no daemon).

    python -m benchmarks.cli_latency_compare --before /path/to/old/tree [--after .] [--rounds 7]
        [--keep DIR] [--config config.toml] [--daemon]

`--before`/`--after` are folders holding `orchestrator/` (e.g. `git archive main orchestrator
notifiers | tar -x -C /tmp/before`); each arm runs `python -m orchestrator.cli` with PYTHONPATH
set to its tree. Bytecode is written on the warm-up run (PYTHONDONTWRITEBYTECODE is dropped), as
an installed orch has it. `--config` measures with a config.toml (ORCH_CONFIG); `--daemon` with a
daemon running on a copy of the store (its [budget] total already spent, so it starts nothing).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.home.paths import Home

from .cli_latency import fill
from .common import REPO

COMMANDS = {"orch status": ["status"], "orch status --json": ["status", "--json"]}


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr.decode()[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=REPO)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, default=None, help="fill (or reuse) this ORCH_HOME")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--daemon", action="store_true")
    opts = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-cmp-"))
    daemon_env = None
    try:
        root = (opts.keep or tmp / "home").resolve()
        if not (root / "orch.db").exists():
            fill(Home(root), opts.jobs)
        if opts.daemon:  # a copy: the daemon settles the jobs recorded running
            copy = tmp / "daemon-home"
            shutil.copytree(root, copy)
            (copy / "config.toml").write_text("[budget]\ntotal = 0.001\n")  # spent: nothing starts
            root = copy
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "ORCH_CONFIG")}
        env["ORCH_HOME"] = str(root)
        if opts.config:
            env["ORCH_CONFIG"] = str(opts.config.resolve())
        trees = {"before": str(opts.before.resolve()), "after": str(opts.after.resolve())}
        arms = {name: {**env, "PYTHONPATH": tree} for name, tree in trees.items()}
        orch = [sys.executable, "-m", "orchestrator.cli"]
        if opts.daemon:
            daemon_env = arms["after"]
            subprocess.run([*orch, "daemon", "start"], env=daemon_env, check=True, capture_output=True)
            time.sleep(2.0)  # its first ticks (the lost attempts settled) before measuring
        for arm in arms.values():  # warm-up: bytecode written
            for args in COMMANDS.values():
                cpu_of([*orch, *args], arm)
        samples: dict[tuple[str, str], list[float]] = {}
        for r in range(opts.rounds):
            for label, args in COMMANDS.items():
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                samples.setdefault(("python", ""), []).append(cpu_of([sys.executable, "-c", "pass"], env))
                for name in order:
                    samples.setdefault((name, label), []).append(cpu_of([*orch, *args], arms[name]))
        bare = statistics.median(samples[("python", "")])
        where = ("a daemon running" if opts.daemon else "no daemon") + (", a config.toml" if opts.config else "")
        print(f"bare `python -c pass`: {bare * 1000:.0f} ms CPU; {opts.rounds} alternated rounds; {where}")
        for label in COMMANDS:
            old, new = statistics.median(samples[("before", label)]), statistics.median(samples[("after", label)])
            print(
                f"{label:<22} before {old * 1000:5.0f} ms = {old / bare:4.1f}x   after {new * 1000:5.0f} ms = "
                f"{new / bare:4.1f}x"
            )
        return 0
    finally:
        if daemon_env is not None:
            subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "daemon", "stop"], env=daemon_env, capture_output=True
            )
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
