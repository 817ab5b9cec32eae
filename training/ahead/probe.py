"""`python -m training.probe JOB_TOML [--warmup W] [--steps N]`: the measurement behind `orch estimate`.
Runs the real built-in job on this machine for W + N optimizer steps in a temporary run folder
(never the store's), with one checkpoint save at the last step and one evaluation pass, and prints
one JSON line: the steady steps/s after the warm-up, the time to the first step, one save's stall,
one evaluation pass, and the sizes the real job will have (steps per epoch, total steps, evaluations)."""

from __future__ import annotations

import time

PROCESS_START = time.time()  # before the heavy imports: they are part of a real start-up too

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Optional  # noqa: E402

from orchestrator.contract import (  # noqa: E402
    ENV_ATTEMPT,
    ENV_CKPT_DIR,
    ENV_JOB_ID,
    ENV_PROBE_WARMUP,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    JOB_TOML,
    checkpoint_dir,
)

DEFAULT_WARMUP, DEFAULT_STEPS = 10, 30


def evals_per_epoch(val_check_interval: float | int, batches_per_epoch: int) -> float:
    """Validation passes Lightning runs in one epoch: every int(batches x fraction) batches for a
    fraction; for a whole number N, every N batches counted across epochs (a fraction of a pass
    an epoch when N exceeds an epoch)."""
    if batches_per_epoch <= 0:
        return 0
    if isinstance(val_check_interval, float):
        every = max(1, int(batches_per_epoch * val_check_interval))
        return batches_per_epoch // every
    return batches_per_epoch / max(1, int(val_check_interval))


def probe_spec(
    spec_dict: dict[str, Any],
    probe_steps: int,
    steps_per_epoch: int,
    accumulate: int,
    batches_per_epoch: int,
    has_val: bool,
) -> dict[str, Any]:
    """The job as the probe runs it: W + N steps, one save at the last of them, no early stop,
    and an evaluation pass within the probe."""
    spec = json.loads(json.dumps(spec_dict))
    train = spec.setdefault("train", {})
    train["max_steps"] = probe_steps
    train["max_epochs"] = math.ceil(probe_steps / max(1, steps_per_epoch)) + 1
    train.pop("hang_minutes", None)
    spec.pop("early_stopping", None)
    spec.pop("budget", None)
    ck = spec.setdefault("checkpoint", {})
    for key in ("every", "mtbf_hours"):
        ck.pop(key, None)
    ck["every_n_steps"] = probe_steps
    ck["every_minutes"] = 1e6  # no time-based save inside the probe
    if has_val and batches_per_epoch > probe_steps * accumulate:
        # one pass, at about the probe's last step; a fraction of the epoch stays valid when the
        # epoch turns out shorter than counted here (packed rows)
        train["val_check_interval"] = probe_steps * accumulate / batches_per_epoch
    return spec


def probe(job_toml: Path, warmup: int, steps: int) -> dict[str, Any]:
    import tomli_w

    from orchestrator.spec.jobspec import load_jobspec

    from training.builtin.data import load_split
    from training.builtin.job_plan import plan_devices, total_steps
    from training.builtin.run import main as run_main

    spec = load_jobspec(job_toml)
    if spec.is_command:
        raise SystemExit("a command job has no built-in probe")
    assert spec.train is not None and spec.data is not None
    train = spec.train
    world = plan_devices(spec)["world"]
    counted = time.time()
    rows = load_split(spec.data.train, "train").num_rows
    counting_s = time.time() - counted  # the probe's own work: not part of the job's start-up
    batches = math.ceil(math.ceil(rows / world) / train.batch_size)
    steps_per_epoch = math.ceil(batches / train.accumulate_grad_batches)
    total = total_steps(rows, world, train.batch_size, train.accumulate_grad_batches, train)
    has_val = spec.data.validation is not None
    probe_steps = min(total, warmup + steps)
    warmup = min(warmup, max(1, probe_steps // 3))
    with tempfile.TemporaryDirectory(prefix="orch-probe-") as tmp:
        run_dir = Path(tmp)
        body = probe_spec(
            spec.to_toml_dict(), probe_steps, steps_per_epoch, train.accumulate_grad_batches, batches, has_val
        )
        (run_dir / JOB_TOML).write_text(tomli_w.dumps(body))
        os.environ.update(
            {
                ENV_RUN_DIR: str(run_dir),
                ENV_CKPT_DIR: str(checkpoint_dir(run_dir)),
                ENV_ATTEMPT: "1",
                ENV_RESUME_FROM: "",
                ENV_PROBE_WARMUP: str(warmup),
            }
        )
        os.environ.pop(ENV_JOB_ID, None)
        code = run_main(run_dir)
        ended = time.time()
        from training.heartbeat.goodput import PROBE

        figures = json.loads((run_dir / PROBE).read_text()) if (run_dir / PROBE).exists() else {}
    if code != 0 or not figures:
        raise SystemExit(f"the probe run failed (exit {code}); see the lines above")
    # The epoch as the trainer saw it (after packing or filtering), not as the rows were counted.
    batches = int(figures.get("batches_per_epoch") or batches)
    steps_per_epoch = math.ceil(batches / train.accumulate_grad_batches)
    total = steps_per_epoch * train.max_epochs if train.max_epochs else None
    total = max(1, min(total, train.max_steps) if total and train.max_steps else (total or train.max_steps or 1))
    first = figures.get("first_step_at")
    from training.ahead.param_count import parameter_counts, peak_gpu_bytes

    counts = parameter_counts(spec) or {}
    return {
        # what each rank holds (orchestrator/planning/rank_memory.py): the model's parameters and,
        # on a GPU, the peak its tensors reached (the activations of one micro-batch are the rest)
        "params": counts.get("params"),
        "trainable_params": counts.get("trainable_params"),
        "frozen_bytes": counts.get("frozen_bytes"),
        "peak_gpu_bytes": peak_gpu_bytes(),
        "steps_per_s": figures.get("steady_steps_per_s"),
        "steady_steps": figures.get("steady_steps"),
        "warmup_steps": warmup,
        "probe_steps": probe_steps,
        "startup_s": (first - PROCESS_START - counting_s) if first else None,
        "checkpoint_s": figures["checkpoint_s"] / figures["checkpoints"] if figures.get("checkpoints") else None,
        "eval_pass_s": figures["eval_s"] / figures["evals"] if figures.get("evals") else None,
        "data_wait_per_step_s": figures["data_wait_s"] / figures["steps"] if figures.get("steps") else None,
        # after the last step: the final evaluation and save are counted above; the rest (export of
        # the model, result.json, shutdown) is the end every run has
        "end_s": max(0.0, ended - figures["last_step_at"] - figures.get("after_last_step_s", 0.0))
        if figures.get("last_step_at")
        else None,
        # the CLI, which sees this process start and end, recomputes start-up and end from these
        "first_step_at": first,
        "last_step_at": figures.get("last_step_at"),
        "counting_s": counting_s,
        "after_last_step_s": figures.get("after_last_step_s", 0.0),
        "rows": rows,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total,
        "evals": (evals_per_epoch(train.val_check_interval, batches) * total / steps_per_epoch) if has_val else 0,
        "world": world,
        # what load does not move, and the load it ran under (planning/speed_range.py)
        "cpu_per_wall": figures.get("steady_cpu_per_wall"),
        "typical_share": figures.get("steady_typical_share"),
        "others_runnable": figures.get("others_runnable"),
        "threads": _threads(),
        "cpus": _cpus(),
        "probe_s": time.time() - PROCESS_START,
    }


def _threads() -> int:
    import torch

    return max(1, int(torch.get_num_threads()))


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cli(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.probe", description=__doc__)
    parser.add_argument("job_toml")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args(argv)
    result = probe(Path(args.job_toml), max(1, args.warmup), max(1, args.steps))
    result["probe_s"] = time.time() - PROCESS_START
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
