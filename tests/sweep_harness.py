"""A small command job for sweep tests: it reads its parameter from the command line and from
ORCH_PARAM_X, reports `score` in progress.json at every step, saves a notice checkpoint and
exits 75 on SIGTERM, resumes from ORCH_RESUME_FROM, and records every start in starts.jsonl."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import tomli_w

SCORE_SCRIPT = r"""
import json, os, signal, sys, time
x = float(sys.argv[1])
steps, pause = int(os.environ.get("STEPS", "8")), float(os.environ.get("PAUSE", "0.05"))
run, ck = os.environ["ORCH_RUN_DIR"], os.environ["ORCH_CKPT_DIR"]
start = int(open(os.environ["ORCH_RESUME_FROM"]).read()) if os.environ.get("ORCH_RESUME_FROM") else 0
with open(os.path.join(os.environ["RECORD_DIR"], "starts.jsonl"), "a") as f:
    f.write(json.dumps({"job": int(os.environ["ORCH_JOB_ID"]), "x_arg": x, "x_env": os.environ["ORCH_PARAM_X"],
                        "attempt": int(os.environ["ORCH_ATTEMPT"]), "from": start}) + "\n")
step = start
def on_term(signum, frame):
    with open(os.path.join(ck, "notice-step-%08d.ckpt" % step), "w") as f:
        f.write(str(step))
    sys.exit(75)
signal.signal(signal.SIGTERM, on_term)
for s in range(start + 1, steps + 1):
    time.sleep(pause)
    step = s
    tmp = os.path.join(run, ".progress.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": s, "total_steps": steps, "metrics": {"score": s * (1 - (x - 0.3) ** 2)},
                   "updated_at": time.time()}, f)
    os.replace(tmp, os.path.join(run, "progress.json"))
"""


def write_score_job(folder: Path, *, steps: int = 8, pause: float = 0.05, retries: int = 0) -> Path:
    (folder / "score.py").write_text(SCORE_SCRIPT)
    job = {
        "name": "score",
        "gpus": 0,
        "retries": retries,
        "command": [sys.executable, "score.py", "{x}"],
        "env": {"STEPS": str(steps), "PAUSE": str(pause), "RECORD_DIR": str(folder)},
    }
    path = folder / "job.toml"
    path.write_text(tomli_w.dumps(job))
    return path


def write_sweep(folder: Path, name: str = "sweep", *, params: Any = None, **sweep: Any) -> Path:
    table = {
        "job": "job.toml",
        "trials": 4,
        "parallel": 2,
        "sampler": "random",
        "seed": 1,
        "objective": "score",
        "direction": "maximize",
        **sweep,
        "params": params or {"x": {"uniform": [0.0, 1.0]}},
    }
    path = folder / f"{name}.toml"
    path.write_text(tomli_w.dumps({"sweep": table}))
    return path


def starts(folder: Path) -> list[dict[str, Any]]:
    path = folder / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
