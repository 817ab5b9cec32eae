"""Recovery without a human, timed: a machine is lost, `orch watch` notices, its `command` provider
brings up a replacement "machine" on this host (a fresh ORCH_HOME whose bootstrap runs
`orch adopt URL --job UID --yes` and `orch daemon start`), and the job trains again there.
A tiny BERT (the tests' workload) under the built-in runner, mirrored to a file:// store.

Per run, split (medians over the runs):
- detection: the machine killed -> the launch command called (the controller's poll and
  [storage] stale_after_minutes; also shown from the lease's last heartbeat). Goal:
  <= stale_after + one poll (from the last heartbeat).
- launch: the provider's own time (the launch command's run time, recorded in the claim; on a
  real cloud add the instance's boot, which the provider does not control).
- adopt: the bootstrap's `orch adopt` (download + sha256 verify + import).
- resume: `orch daemon start` -> the first step past the checkpoint on the new machine.
- steps lost: after a preemption notice (goal 0) and without one (at most the checkpoint interval).
Also a cold start of the same job (a fresh home, `orch daemon start` -> its first step) as the
yardstick, alternated with the runs: goal adopt + resume <= 1.5 x cold start. adopt + resume is the
hand-over a new machine costs the job (adopt -> its first step past the checkpoint), which
benchmarks/market.py charges every adoption and planned move (--handover-minutes).

    python -m benchmarks.recovery [--runs 3] [--stale-min 0.1] [--poll 0.5] [--json]

About 40 s per run on 2 CPU cores (each run: one with a notice, one without).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

EVERY = 10  # checkpoint interval (steps)


def workload(root: Path) -> dict[str, Path]:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    texts = [r["text"] for r in sentiment_rows(1000, seed=1)]
    model = build_tiny_bert(root / "tiny-bert", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    train = write_jsonl(root / "train.jsonl", sentiment_rows(640, seed=11))
    return {"model": model, "train": train, "hf_cache": root / "hf-cache"}


def submit(h: Any, w: dict[str, Path], name: str) -> int:
    import tomli_w

    from orchestrator.jobs.lifecycle import submit_job
    from orchestrator.home.wake import poke

    spec: dict[str, Any] = {
        "name": name,
        "gpus": 0,
        "model": {"name_or_path": str(w["model"]), "num_labels": 2},
        "data": {"train": str(w["train"]), "max_length": 32, "num_workers": 0, "shuffle": True},
        "train": {"max_epochs": 2, "batch_size": 16, "precision": "32", "learning_rate": 1e-3, "seed": 7},
        "checkpoint": {"every_n_steps": EVERY, "keep": 2},
        "env": {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(w["hf_cache"]),
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": "0.1",
            "ORCH_FAULT_SLOW_STEP_S": "0.1",
        },
    }
    path = h.jobs_dir / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0)
    poke(h.home.wake_socket)
    return job.id


def step_of(run_dir: Path) -> tuple[int, float]:
    from orchestrator.contract import read_json

    p = read_json(run_dir / "progress.json") or {}
    return int(p.get("step") or 0), float(p.get("updated_at") or 0.0)


def wait(pred: Any, timeout: float, what: str, interval: float = 0.02) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise SystemExit(f"timed out waiting for {what}")


def cold_start(tmp: Path, w: dict[str, Path]) -> float:
    from tests.daemon_harness import OrchHome

    folder = tmp / f"cold-{time.monotonic_ns()}"
    folder.mkdir()
    h = OrchHome(folder, cpu_slots=1, grace_seconds=30)
    try:
        job_id = submit(h, w, "cold")
        started = time.time()
        h.cli("daemon", "start")
        wait(lambda: step_of(h.run_dir(job_id))[0] >= 1, 120, "the cold job's first step")
        return step_of(h.run_dir(job_id))[1] - started
    finally:
        h.cleanup()


def one_run(tmp: Path, w: dict[str, Path], *, notice: bool, stale_min: float, poll: float) -> dict[str, float]:
    from orchestrator.spec.config import load_config
    from orchestrator.objectstore import claims as cl
    from orchestrator.objectstore import manifest as mf
    from orchestrator.objectstore.remote import Remote
    from orchestrator.home.paths import Home
    from orchestrator.store import Store
    from tests.daemon_harness import kill_leftover_attempts
    from tests.mirror.mirror_harness import storage_home
    from tests.mirror.recovery_harness import Watch, controller_home, machines_folder, stop_machine, times

    run = tmp / f"run-{time.monotonic_ns()}"
    url = f"file://{run}/store"
    a = storage_home(run / "a", url, stale_after_minutes=stale_min, keep=2)
    cfg = a.root / "config.toml"
    (run / "machine-config.toml").write_text(cfg.read_text())
    cfg.write_text(cfg.read_text() + '\n[preemption]\nsources = ["file"]\npoll_seconds = 0.2\n')
    a.config = load_config(cfg, required=True)
    machines = machines_folder(run, run / "machine-config.toml")
    croot = controller_home(
        run,
        url,
        {"provider": "command", "launch": ["bash", str(machines / "launch.sh")], "poll_seconds": poll},
        stale_after_minutes=stale_min,
    )
    watch = Watch(croot, {"MACHINES": str(machines)})
    remote = Remote(a.config.storage)
    new = machines / "launch-1"
    try:
        a.start_daemon()
        job_id = submit(a, w, "lost")
        uid = a.job(job_id).uid
        watch.start()
        at = random.Random().randint(EVERY + 2, 3 * EVERY)
        wait(lambda: step_of(a.run_dir(job_id))[0] >= at, 120, f"step {at}")
        if notice:
            (a.root / "preempt-notice").touch()

            def noticed() -> bool:
                raw = remote.get_bytes(mf.manifest_key(uid))
                m = json.loads(raw) if raw else {}
                return bool(m.get("checkpoints") and m["checkpoints"][0]["notice"] and m["state"] == "queued")

            wait(noticed, 60, "the notice checkpoint mirrored")
        reached = step_of(a.run_dir(job_id))[0]
        last_hb = float(json.loads(remote.get_bytes(mf.manifest_key(uid)) or b"{}")["owner"]["heartbeat"])
        for proc in a.daemons:
            proc.kill()
            proc.wait(5)
        kill_leftover_attempts(a.home)
        killed = time.time()
        reached = max(reached, step_of(a.run_dir(job_id))[0])
        a.store.close()
        shutil.rmtree(a.root)
        last_hb = max(last_hb, float(json.loads(remote.get_bytes(mf.manifest_key(uid)) or b"{}")["owner"]["heartbeat"]))

        def training_again() -> Any:
            db = Home(new / "home").db
            if not db.exists():
                return None
            store = Store(db)
            try:
                job = store.by_uid(uid)
                attempts = store.attempts(job.id) if job is not None else []
            finally:
                store.close()
            if job is None:
                return None
            run_dir = Home(new / "home").run_dir(job.id)
            if not attempts or attempts[-1].resumed_from_step is None:
                return None
            step, at_ = step_of(run_dir)
            # progress.json as the new machine wrote it: the adoption imports the old machine's,
            # whose step may already be past the checkpoint (no notice) and whose time is older.
            adopted = times(new).get("adopted") if (new / "times").exists() else None
            if adopted is None or at_ <= adopted:
                return None
            return (attempts[-1].resumed_from_step, step, at_) if step > attempts[-1].resumed_from_step else None

        resumed_from, _, first_step_at = wait(training_again, 180, "training on the new machine", 0.05)
        t = times(new)
        claim = cl.read_claims(remote, uid)[0]
        return {
            "detection_s": t["launch_called"] - killed,
            "detection_from_heartbeat_s": t["launch_called"] - last_hb,
            "launch_s": float(json.loads(remote.get_bytes(cl.claim_key(uid, claim.n)) or b"{}")["launch_seconds"]),
            "adopt_s": t["adopted"] - t["booted"],
            "resume_s": first_step_at - t["adopted"],
            "lost_to_training_s": first_step_at - killed,
            "steps_lost": float(reached - resumed_from),
        }
    finally:
        watch.stop()
        stop_machine(new)
        if a.root.exists():
            a.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stale-min", type=float, default=0.1)
    ap.add_argument("--poll", type=float, default=0.5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="orch-recovery-bench-"))
    try:
        w = workload(tmp)
        cold_start(tmp, w)  # warm-up: imports and the tokenized-data cache
        colds: list[float] = []
        runs: dict[str, list[dict[str, float]]] = {"notice": [], "no notice": []}
        for i in range(args.runs):  # the yardstick alternated with the runs: a load change hits both
            for kind in ("cold", "notice", "no notice") if i % 2 == 0 else ("no notice", "notice", "cold"):
                if kind == "cold":
                    colds.append(cold_start(tmp, w))
                else:
                    got = one_run(tmp, w, notice=kind == "notice", stale_min=args.stale_min, poll=args.poll)
                    runs[kind].append(got)
        cold = statistics.median(colds)
        out: dict[str, Any] = {
            "stale_after_s": args.stale_min * 60,
            "poll_s": args.poll,
            "cold_start_s": cold,
            "all_cold_start_s": [round(c, 1) for c in colds],
        }
        for kind, rs in runs.items():
            out[kind] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            out[kind]["all_steps_lost"] = [int(r["steps_lost"]) for r in rs]
            # The hand-over a new machine costs the job (what benchmarks/market.py --handover-minutes
            # charges): its `orch adopt` to its first step past the checkpoint.
            out[kind]["handover_s"] = statistics.median(r["adopt_s"] + r["resume_s"] for r in rs)
            out[kind]["all_handover_s"] = [round(r["adopt_s"] + r["resume_s"], 1) for r in rs]
        if args.json:
            print(json.dumps(out, indent=2))
            return
        print(
            f"stale_after {out['stale_after_s']:.0f} s, poll {args.poll:g} s, {args.runs} run(s) each, medians; "
            f"cold start (daemon start -> first step) {cold:.1f} s"
        )
        print(
            "| | detection (kill -> launch) | from last heartbeat | launch | adopt | resume | adopt + resume vs cold | lost -> training | steps lost |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for kind in ("notice", "no notice"):
            r = out[kind]
            print(
                f"| {kind} | {r['detection_s']:.1f} s | {r['detection_from_heartbeat_s']:.1f} s | {r['launch_s']:.2f} s | "
                f"{r['adopt_s']:.1f} s | {r['resume_s']:.1f} s | {(r['adopt_s'] + r['resume_s']) / cold:.2f}x | "
                f"{r['lost_to_training_s']:.1f} s | {r['all_steps_lost']} |"
            )
        print(f"cold starts: {out['all_cold_start_s']} s")
        for kind in ("notice", "no notice"):
            r = out[kind]
            print(
                f"hand-over ({kind}): adopt -> first step {r['handover_s']:.1f} s median "
                f"({r['all_handover_s']} s), {r['handover_s'] / cold:.2f}x a cold start"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
