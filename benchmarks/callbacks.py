"""What orch's callbacks and loggers cost per training step, around a step that does nothing.

A Lightning fit on the CPU whose training step is one multiply of a one-element parameter (and
the same `self.log("train_loss", ..., prog_bar=True)` as the runner's module), so the callbacks'
cost is not hidden under the model's. Three arms, alternated, `--reps` runs each:

  none     only a clock callback (in every arm);
  empty    five callbacks that override nothing: Lightning's cost of dispatching each per-step
           hook to one more callback (the runner adds five);
  runner   the built-in runner's set: OrchCallback, ModelCheckpoint (time-based, not due),
           FinalCheckpoint, HealthCallback, RateAndLR, GoodputMeter (where the tree has it), and
           its loggers (metrics.csv, TensorBoard);
  wandb, swanlab, mlflow (with --trackers)   the runner's set plus that experiment tracker
           ([tracking], training/tracking/trackers.py), offline / MLflow on a file store, opened before
           the clock starts. `<tracker> - runner` is its cost per step; CPU time counts its
           worker thread too (W&B's wandb-core process is outside this process's clock).

All times are CPU time (process_time for whole steps, thread_time inside hooks), which holds up
when other work shares the machine far better than wall time. In the runner arm every hook of
every callback, and every logger call, is timed from inside: each one's own cost in microseconds
per step. (Work orch does on its writer threads is in the process's CPU time, not in a hook's.) `runner - none` (per step, median of the paired runs) is the whole
bill, own costs plus dispatch; the report shows both so they can be checked against each other.

    python -m benchmarks.callbacks [--steps 1500] [--reps 7] [--trackers] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_train_start",
    "on_train_end",
    "on_save_checkpoint",
    "state_dict",
)
LOGGER_CALLS = ("log_metrics", "save")
TRACKERS = ("wandb", "swanlab", "mlflow")


def open_tracker(name: str, run_dir: Path):
    """One tracker as the runner opens it ([tracking] backends = [name], offline), its run started
    before the clock does."""
    from types import SimpleNamespace

    from training.tracking.trackers import open_trackers

    os.environ["ORCH_JOB_UID"] = "bench-" + "".join(c for c in run_dir.name if c.isalnum())[-16:]
    os.environ.update(WANDB_SILENT="true", WANDB_MODE="offline", MLFLOW_ALLOW_FILE_STORE="true")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    tracking = SimpleNamespace(backends=[name], project="bench", mode="offline", mlflow_uri=None)
    with contextlib.redirect_stdout(sys.stderr):  # SwanLab's banner: --json's stdout stays JSON
        trackers = open_trackers(tracking, run_dir, "bench", resume_step=None)
        assert trackers is not None
        trackers.workers[0].ready.wait(120)
    OPEN.append(trackers)
    return trackers


OPEN: list[Any] = []  # the trackers of the run in progress, closed after it
SKIP = 100  # steps before the clock starts (Lightning's first steps set things up)


def build(arm: str, run_dir: Path, steps: int):
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Rows(Dataset):
        def __len__(self) -> int:
            return steps * 4

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": torch.zeros(8, dtype=torch.long), "labels": torch.tensor(i % 2)}

    class NoOp(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss = (self.w * 0.5).sum()
            self.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=4)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, trainer, *args: Any) -> None:
            self.times.append(time.process_time())

    clock = Clock()
    callbacks: list[Any] = [clock]
    loggers: list[Any] = []
    if arm == "empty":
        callbacks += [type(f"Empty{i}", (pl.Callback,), {})() for i in range(5)]
    elif arm == "runner" or arm in TRACKERS:
        from pytorch_lightning.callbacks import ModelCheckpoint

        from training.callbacks import OrchCallback
        from training.heartbeat.health import HealthCallback
        from training.builtin.job import FinalCheckpoint
        from training.logs.run_logs import RateAndLR, run_loggers

        ckpt_dir = run_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        callbacks += [
            OrchCallback(run_dir=run_dir, ckpt_dir=ckpt_dir),
            ModelCheckpoint(
                dirpath=str(ckpt_dir),
                filename="step-{step:08d}",
                save_top_k=-1,
                train_time_interval=timedelta(minutes=10),
            ),
            FinalCheckpoint(ckpt_dir),
            HealthCallback(run_dir, ckpt_dir, attempt="1"),
            RateAndLR(),
        ]
        try:
            from training.heartbeat.goodput import GoodputMeter  # the goodput ledger's meter, where the tree has it
        except ImportError:
            pass
        else:
            callbacks.append(GoodputMeter(run_dir, "1"))
        loggers = run_loggers(run_dir, resume_step=None, job_name="bench")
        if arm in TRACKERS:
            loggers += open_tracker(arm, run_dir).loggers
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=loggers or False,
        enable_checkpointing=arm != "none" and arm != "empty",
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=10,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        default_root_dir=str(run_dir),
    )
    loader = DataLoader(Rows(), batch_size=4, num_workers=0)
    return trainer, NoOp(), loader, clock, callbacks[1:], loggers


def instrument(objects: list[Any], names: tuple[str, ...], spent: dict[str, float]) -> None:
    """Wrap these methods of each object with a timer adding into spent[Class.method]; for a
    callback only the hooks its class overrides (the base's no-ops are dispatch cost)."""
    import pytorch_lightning as pl

    for obj in objects:
        for name in names:
            if not callable(getattr(obj, name, None)):
                continue
            defined_in = next((k for k in type(obj).__mro__ if name in vars(k)), object)
            if defined_in in (pl.Callback, object):
                continue
            original = getattr(obj, name)
            key = f"{type(obj).__name__}.{name}"

            def timed(*args: Any, _original=original, _key=key, **kwargs: Any) -> Any:
                start = time.thread_time()
                try:
                    return _original(*args, **kwargs)
                finally:
                    spent[_key] += time.thread_time() - start

            setattr(obj, name, timed)


def one_run(arm: str, steps: int, work: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=work, prefix=f"{arm}-"))
    trainer, model, loader, clock, callbacks, loggers = build(arm, run_dir, steps)
    spent: dict[str, float] = defaultdict(float)
    if arm == "runner" or arm in TRACKERS:
        instrument(callbacks, HOOKS, spent)
        instrument(loggers, LOGGER_CALLS, spent)
    trainer.fit(model, loader)
    while OPEN:
        trackers = OPEN.pop()
        with contextlib.redirect_stdout(sys.stderr):
            trackers.close("finished")
        failed = [w.backend.name for w in trackers.workers if w.failed]
        if failed:
            print(f"tracker {failed} failed: see {run_dir}/tracking.json", file=sys.stderr)
    timed = clock.times[SKIP:]
    n = len(timed) - 1
    # own costs over the same steps would need per-step marks; over the whole run they are per step
    return {
        "us_per_step": (timed[-1] - timed[0]) / n * 1e6,
        "callbacks": len(callbacks),
        "own_us_per_step": {k: v / steps * 1e6 for k, v in spent.items()},
    }


def spread(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": values[0], "max": values[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--trackers", action="store_true", help="also an arm per experiment tracker")
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    arms = ("none", "empty", "runner") + (TRACKERS if args.trackers else ())
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="orch-cb-bench-") as tmp:
        warm = one_run("runner", SKIP + 50, Path(tmp))  # warm-up: imports, first files
        extra = warm["callbacks"]  # callbacks the runner adds (dispatch is paid for each)
        for rep in range(args.reps):
            for arm in arms if rep % 2 == 0 else arms[::-1]:
                runs[arm].append(one_run(arm, args.steps, Path(tmp)))
            print(
                f"rep {rep + 1}: " + ", ".join(f"{a} {runs[a][-1]['us_per_step']:.0f} us/step" for a in arms),
                file=sys.stderr,
                flush=True,
            )
    own: dict[str, list[float]] = defaultdict(list)
    for r in runs["runner"]:
        for k, v in r["own_us_per_step"].items():
            own[k].append(v)
    per_callback: dict[str, float] = defaultdict(float)
    for k, vs in own.items():
        per_callback[k.split(".")[0]] += statistics.median(vs)
    none = [r["us_per_step"] for r in runs["none"]]
    report = {
        "steps": args.steps,
        "reps": args.reps,
        "load_avg_1m": [load_before, os.getloadavg()[0]],
        "step_us": {a: spread([r["us_per_step"] for r in runs[a]]) for a in arms},
        "dispatch_us_per_callback": spread([(e["us_per_step"] - n) / 5 for e, n in zip(runs["empty"], none)]),
        "runner_minus_none_us": spread([(r["us_per_step"] - n) for r, n in zip(runs["runner"], none)]),
        "own_us_per_step": {k: spread(v) for k, v in sorted(own.items())},
        "own_us_per_callback": dict(sorted(per_callback.items(), key=lambda kv: -kv[1])),
    }
    report["own_total_us"] = sum(per_callback.values())
    report["runner_callbacks"] = extra
    report["own_plus_dispatch_us"] = report["own_total_us"] + extra * report["dispatch_us_per_callback"]["median"]
    runner_step = [r["us_per_step"] for r in runs["runner"]]
    report["trackers"] = {
        t: {
            "minus_runner_us": spread([r["us_per_step"] - b for r, b in zip(runs[t], runner_step)]),
            "logger_own_us": spread([r["own_us_per_step"].get("TrackerLogger.log_metrics", 0.0) for r in runs[t]]),
        }
        for t in arms
        if t in TRACKERS
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    s = report["step_us"]
    print(
        f"no-op step, CPU, {args.steps} steps x {args.reps} runs per arm, alternated; load "
        f"{report['load_avg_1m'][0]:.1f} -> {report['load_avg_1m'][1]:.1f}"
    )
    print(
        f"  step us (median): none {s['none']['median']:.0f}, empty x5 {s['empty']['median']:.0f}, "
        f"runner {s['runner']['median']:.0f}"
    )
    d = report["dispatch_us_per_callback"]
    print(
        f"  Lightning's dispatch, per callback per step: {d['median']:.1f} us (quartiles {d['q1']:.1f}-{d['q3']:.1f})"
    )
    print("  own cost per step (us, median over runs):")
    for name, us in report["own_us_per_callback"].items():
        print(f"    {name:22s} {us:8.1f}")
        for k, v in report["own_us_per_step"].items():
            if k.startswith(name + ".") and v["median"] >= 0.05:
                print(f"      {k.split('.', 1)[1]:28s} {v['median']:8.2f}")
    r = report["runner_minus_none_us"]
    print(
        f"  own total {report['own_total_us']:.1f} us + {extra} x dispatch = {report['own_plus_dispatch_us']:.1f} us; "
        f"measured runner - none: {r['median']:.1f} us (quartiles {r['q1']:.1f}-{r['q3']:.1f})"
    )
    for t, figures in report["trackers"].items():
        m, own_t = figures["minus_runner_us"], figures["logger_own_us"]
        print(
            f"  tracker {t}: {t} - runner {m['median']:.1f} us/step (quartiles {m['q1']:.1f}-{m['q3']:.1f}), "
            f"{100 * m['median'] / max(r['median'], 1e-9):.1f} % of runner - none; in the step (log_metrics) "
            f"{own_t['median']:.2f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
