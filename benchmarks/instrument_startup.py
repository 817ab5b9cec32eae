"""What `instrument` costs a Python start-up that imports neither transformers nor Lightning: `python
-c pass` (and `python -c "import json"`, a program that imports something) with and without orch's
bootstrap first on PYTHONPATH, arms alternated round by round after a warm-up, wall time and the
child's CPU time per run, medians. Also, once, the cost of the bootstrap when a program does import
the Trainer: `import transformers.trainer` with and without it (attaching orch's callback).

    python -m benchmarks.instrument_startup [--rounds 30] [--trainer-rounds 3]

Goal (issue 46): no measurable overhead when neither framework is imported."""

from __future__ import annotations

import argparse
import os
import py_compile
import re
import resource
import statistics
import subprocess
import sys
import time

from .common import REPO

BOOT = REPO / "training" / "instrument" / "boot"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    cpu0, t0 = _children_cpu(), time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, _children_cpu() - cpu0


def arms() -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    base["PYTHONPATH"] = str(REPO)
    boot = dict(base, PYTHONPATH=os.pathsep.join([str(BOOT), str(REPO)]), ORCH_INSTRUMENT="auto")
    return {"bare": base, "bootstrap": boot}


def measure(code: str, rounds: int) -> dict[str, dict[str, float]]:
    envs = arms()
    argv = [sys.executable, "-c", code]
    for env in envs.values():  # warm-up: page cache, .pyc files
        timed(argv, env)
    wall: dict[str, list[float]] = {name: [] for name in envs}
    cpu: dict[str, list[float]] = {name: [] for name in envs}
    for i in range(rounds):
        order = list(envs) if i % 2 == 0 else list(reversed(envs))
        for name in order:
            w, c = timed(argv, envs[name])
            wall[name].append(w)
            cpu[name].append(c)
    return {
        name: {
            "wall_ms": statistics.median(wall[name]) * 1e3,
            "cpu_ms": statistics.median(cpu[name]) * 1e3,
            "wall_q1_ms": statistics.quantiles(wall[name], n=4)[0] * 1e3,
            "wall_q3_ms": statistics.quantiles(wall[name], n=4)[2] * 1e3,
        }
        for name in envs
    }


def report(label: str, found: dict[str, dict[str, float]]) -> None:
    bare, boot = found["bare"], found["bootstrap"]
    print(
        f"{label}: bare {bare['wall_ms']:.1f} ms wall ({bare['wall_q1_ms']:.1f}-{bare['wall_q3_ms']:.1f}), "
        f"{bare['cpu_ms']:.1f} ms CPU; bootstrap {boot['wall_ms']:.1f} ms wall "
        f"({boot['wall_q1_ms']:.1f}-{boot['wall_q3_ms']:.1f}), {boot['cpu_ms']:.1f} ms CPU; "
        f"difference {boot['wall_ms'] - bare['wall_ms']:+.1f} ms wall, {boot['cpu_ms'] - bare['cpu_ms']:+.1f} ms CPU",
        flush=True,
    )


def import_time_us(rounds: int) -> float:
    """The bootstrap's own import (Python's -X importtime, self time of `sitecustomize`), median."""
    env = arms()["bootstrap"]
    found = []
    for _ in range(rounds):
        ran = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True
        )
        match = re.search(r"import time:\s+(\d+) \|.*\|\s+sitecustomize$", ran.stderr, re.M)
        if match:
            found.append(int(match.group(1)))
    return statistics.median(found) if found else float("nan")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--trainer-rounds", type=int, default=3, help="0 skips the transformers.trainer arm")
    args = p.parse_args()
    # As installed: pip compiles a wheel's modules, so Python reads the bootstrap's .pyc (a checkout
    # run with PYTHONDONTWRITEBYTECODE would compile it at every start: about 1 ms more).
    py_compile.compile(str(BOOT / "sitecustomize.py"), doraise=True)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} rounds, arms alternated", flush=True)
    print(f"the bootstrap's own import (-X importtime, median): {import_time_us(args.rounds):.0f} us", flush=True)
    report("python -c pass", measure("pass", args.rounds))
    report('python -c "import json"', measure("import json", args.rounds))
    if args.trainer_rounds:
        report("import transformers.trainer", measure("import transformers.trainer", args.trainer_rounds))


if __name__ == "__main__":
    main()
