"""`python -m tools.gpucheck.jobwrap RUN_DIR [--clock FILE] [--notice-times FILE]`: the built-in
runner (training.run) exactly as orch starts it, with two optional instruments and nothing else:

--clock FILE         appends gpucheck.clock.Clock to the runner's callbacks (the same clock the
                     plain Lightning script carries in the throughput comparison);
--notice-times FILE  times the runner's notice checkpoint (OrchCallback.save_notice, end of step ->
                     durable file, after a CUDA synchronize) and, in the same process on the same
                     state, a bare torch.save of the model and optimizer state dicts + fsync; the
                     order of the two alternates with $GPUCHECK_NOTICE_ORDER. One JSON line per save.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # what training/builtin/run.py does before its heavy imports
    import training.exits

    training.exits.EXIT_AT_ONCE = True
    training.exits.install_early_sigterm()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def add_clock(path: str) -> None:
    import training.builtin.job as job

    from .clock import Clock

    original = job.build_callbacks

    def build_callbacks(*args, **kwargs):
        orch, early, best, callbacks = original(*args, **kwargs)
        callbacks.append(Clock(path))
        return orch, early, best, callbacks

    job.build_callbacks = build_callbacks


def bare_save(trainer, folder: Path) -> dict:
    """torch.save of the model's and the optimizers' state dicts as they sit (on the GPU), fsynced."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bare-save.pt"
    start = time.perf_counter()
    state = {
        "state_dict": trainer.lightning_module.state_dict(),
        "optimizer_states": [opt.state_dict() for opt in trainer.optimizers],
    }
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    path.unlink()
    return {"s": seconds, "bytes": size}


def time_notice(record: str) -> None:
    import torch

    from training.callbacks import OrchCallback

    original = OrchCallback.save_notice

    def save_notice(self, trainer, *args, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the end of the step, on the GPU too
        order = os.environ.get("GPUCHECK_NOTICE_ORDER", "orch-first")
        folder = Path(record).parent / "bare"
        line = {"step": int(trainer.global_step), "order": order}
        if order == "bare-first":
            line["bare"] = bare_save(trainer, folder)
        start = time.perf_counter()
        path = original(self, trainer, *args, **kwargs)
        line["orch_s"] = time.perf_counter() - start
        line["orch_bytes"] = os.path.getsize(path)
        if order != "bare-first":
            line["bare"] = bare_save(trainer, folder)
        with open(record, "a") as fh:
            fh.write(json.dumps(line) + "\n")
        return path

    OrchCallback.save_notice = save_notice


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpucheck.jobwrap")
    parser.add_argument("run_dir")
    parser.add_argument("--clock")
    parser.add_argument("--notice-times")
    args = parser.parse_args(argv)
    if args.clock:
        add_clock(args.clock)
    if args.notice_times:
        time_notice(args.notice_times)
    import training.run

    return training.run.main(args.run_dir)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
