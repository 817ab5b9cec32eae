"""`[checkpoint] every = "auto"`: periodic checkpoints at the Young/Daly interval
sqrt(2 x C x M), C = what a save blocks the step (measured at every save: with background
checkpoints, the snapshot), M = the mean time between preemptions: `mtbf_hours` in job.toml, else
the daemon's figure for this machine (ORCH_MTBF_S: its uptime over the notices and lost attempts
it has seen), else orch's assumption of 6 h. The first save comes after `every_minutes`; each
save re-chooses the interval. What it chose and why goes to checkpoint-interval.json, which
`orch show` prints."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl

from orchestrator.contract import (  # noqa: F401 (young_daly, DEFAULT_MTBF_S re-exported to the tests)
    CHECKPOINT_INTERVAL,
    DEFAULT_MTBF_S,
    ENV_MTBF_S,
    ENV_RUN_DIR,
    mtbf_choice,
    periodic_name,
    write_json_atomic,
    young_daly,
)


def mtbf_for(mtbf_hours: Optional[float], environ: Any = os.environ) -> tuple[float, str]:
    """The job's MTBF by orch's one rule (contract.mtbf_choice), the machine's read from ORCH_MTBF_S."""
    try:
        seen = float(environ.get(ENV_MTBF_S) or 0)
    except ValueError:
        seen = 0.0
    return mtbf_choice(mtbf_hours, seen)


class AutoCheckpoint(pl.Callback):
    def __init__(self, ckpt_dir: Path, run_dir: Optional[Path], *, first_s: float, mtbf_s: float, source: str):
        self.ckpt_dir, self.run_dir = Path(ckpt_dir), run_dir
        self.interval_s, self.mtbf_s, self.source = first_s, mtbf_s, source
        self.cost_s: Optional[float] = None
        self._last = time.monotonic()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last = time.monotonic()
        self._write(trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: only whole optimizer steps are checkpointed
        due = time.monotonic() - self._last >= self.interval_s
        if not trainer.strategy.reduce_boolean_decision(due, all=False):  # one decision for every rank
            return
        path = self.ckpt_dir / periodic_name(trainer.global_step)
        t0 = time.perf_counter()
        if not path.exists():
            trainer.save_checkpoint(str(path), weights_only=False)
        self.cost_s = time.perf_counter() - t0
        self.interval_s = young_daly(self.cost_s, self.mtbf_s)
        self._last = time.monotonic()
        self._write(trainer)

    def _write(self, trainer: pl.Trainer) -> None:
        if self.run_dir is None or trainer.global_rank != 0:
            return
        why = (
            f"sqrt(2 x {self.cost_s:.3f} s x {self.mtbf_s:.0f} s)"
            if self.cost_s is not None
            else "every_minutes, until a save's cost is measured"
        )
        try:
            write_json_atomic(
                self.run_dir / CHECKPOINT_INTERVAL,
                {
                    "interval_s": round(self.interval_s, 3),
                    "cost_s": None if self.cost_s is None else round(self.cost_s, 4),
                    "mtbf_s": round(self.mtbf_s, 1),
                    "mtbf_source": self.source,
                    "why": why,
                    "updated_at": time.time(),
                },
            )
        except OSError:
            pass


def auto_checkpoint(spec: Any, ckpt_dir: Path) -> AutoCheckpoint:
    ck = spec.checkpoint
    mtbf_s, source = mtbf_for(ck.mtbf_hours)
    run_dir = os.environ.get(ENV_RUN_DIR)
    return AutoCheckpoint(
        ckpt_dir,
        Path(run_dir) if run_dir else None,
        first_s=(ck.every_minutes or 10.0) * 60,
        mtbf_s=mtbf_s,
        source=source,
    )
