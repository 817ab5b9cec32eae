"""(f) the GPU's idle time between two queued jobs under a real `orch daemon run` (temporary
ORCH_HOME, one GPU or one CPU slot, jobs queued with `orch submit`), split into its parts."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from .assets import write_rows
from .common import rows
from .frame import Ctx, Section, read_json, wait_for


def daemon_idle(ctx: Ctx, sec: Section) -> None:
    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    s = ctx.sizes
    model = ctx.model(s.model)
    root = ctx.work / "f-daemon"
    home = Home(root / "home").ensure()
    gpus = "[0]" if ctx.gpu else "[]"
    (home.root / "config.toml").write_text(f"[daemon]\ngpus = {gpus}\ncpu_slots = 1\n")
    env = ctx.env(ORCH_HOME=str(home.root))
    daemon = ctx.start([sys.executable, "-m", "orchestrator.cli", "daemon", "run"], env, root / "daemon.out")
    started = wait_for(
        lambda: (home.log_file.exists() and "daemon started" in home.log_file.read_text()) or not daemon.alive(),
        ctx.timeout(60),
        interval=0.05,
    )
    sec.require("the daemon starts", bool(started) and daemon.alive(), daemon.tail())
    data = write_rows(ctx.work / "data" / "daemon.jsonl", rows(ctx, s.daemon_steps * s.batch, seed=13))
    ids = []
    for n in (1, 2):
        folder = root / f"job{n}"
        ctx.write_job(
            folder,
            model=model,
            train=data,
            seq=s.seq,
            batch=s.batch,
            precision=s.throughput_precision,
            lr=s.lr,
            steps=s.daemon_steps,
            name=f"gpucheck-{n}",
        )
        out = ctx.start(
            [sys.executable, "-m", "orchestrator.cli", "submit", str(folder / "job.toml"), "--json"],
            env,
            root / f"submit-{n}.out",
        )
        code = out.wait(ctx.timeout(60))
        sec.require(f"orch submit job {n}", code == 0, out.tail())
        ids.append(json.loads(out.output().strip().splitlines()[-1])["id"])
    store = Store(home.db)
    done = wait_for(
        lambda: all(store.get(i).state.is_terminal for i in ids) or not daemon.alive(),
        ctx.timeout(300 if ctx.gpu else 200),
        interval=0.2,
    )
    states = {i: store.get(i).state.value for i in ids}
    daemon.signal(signal.SIGTERM)
    daemon.wait(30)
    sec.require(
        "both jobs succeeded under the daemon",
        bool(done) and all(v == "succeeded" for v in states.values()),
        f"states {states}; daemon log: {_tail(home.log_file)}",
    )
    run1, run2 = home.run_dir(ids[0]), home.run_dir(ids[1])
    exit1, exit2 = read_json(run1 / "attempt-1.exit") or {}, read_json(run2 / "attempt-1.exit") or {}
    prog1, prog2 = read_json(run1 / "progress.json") or {}, read_json(run2 / "progress.json") or {}
    if ctx.gpu:
        for n, run in ((1, run1), (2, run2)):
            log = (run / "attempt-1.log").read_text(errors="replace") if (run / "attempt-1.log").exists() else ""
            sec.check(f"job {n} trained on the GPU", "no CUDA GPU visible" not in log)
    try:
        gpu_done = float(prog1["updated_at"])  # job 1's last write: on_train_end, after its last step
        parts = {
            "job1_last_step_to_exit_s": float(exit1["ended_at"]) - gpu_done,
            "job1_exit_to_job2_spawn_s": float(exit2["started_at"]) - float(exit1["ended_at"]),
            "job2_spawn_to_train_start_s": float(prog2["train_started_at"]) - float(exit2["started_at"]),
            "job2_train_start_to_first_step_end_s": float(prog2["first_step_at"]) - float(prog2["train_started_at"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        sec.require("the run folders hold the timestamps", False, f"{type(exc).__name__}: {exc}")
        return
    idle = float(prog2["first_step_at"]) - gpu_done
    sec.check(
        "job 2 started only after job 1 ended (one GPU slot)",
        parts["job1_exit_to_job2_spawn_s"] >= 0,
        f"{parts['job1_exit_to_job2_spawn_s']:.3f}",
    )
    sec.check(
        f"the daemon starts the queued job within {s.goal_daemon_gap_s} s of the exit",
        parts["job1_exit_to_job2_spawn_s"] <= s.goal_daemon_gap_s,
        f"{parts['job1_exit_to_job2_spawn_s']:.3f} s",
    )
    sec.figures.update({"gpu_idle_s": idle, **parts, "jobs": ids, "steps_per_job": s.daemon_steps})
    sec.headline = (
        f"GPU idle {idle:.1f} s between the jobs "
        f"(daemon's share {parts['job1_exit_to_job2_spawn_s']:.2f} s;"
        f" job 1 wind-down {parts['job1_last_step_to_exit_s']:.1f} s, job 2 start-up "
        f"{parts['job2_spawn_to_train_start_s']:.1f} s)"
    )


def _tail(path: Path, n: int = 8) -> str:
    try:
        return " / ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


# key, letter, title, function, the least time (s) worth starting it with
