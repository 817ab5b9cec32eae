"""`orch retry ID --gpus N`: a job resumed on another number of GPUs. The built-in runner reshards
its checkpoint and keeps the effective batch (micro-batch x accumulation x ranks) by changing the
accumulation; when no whole accumulation keeps it, the retry is refused here, in one line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ..contract import BATCH, read_json
from ..model.errors import UsageError
from ..model.records import Job


def regpu_spec(job: Job, run_dir: Path, gpus: int) -> dict[str, Any]:
    """The job's spec on `gpus` GPUs (its accumulation adjusted for a built-in job), or UsageError."""
    spec = copy.deepcopy(job.spec)
    if int(spec.get("nodes") or 1) > 1:
        raise UsageError(
            f"orch retry --gpus: job {job.id} runs on {spec['nodes']} nodes; --gpus changes one machine's GPUs only"
        )
    old = max(1, int(job.gpus))
    new = max(1, gpus)
    train = spec.get("train")
    if job.kind == "builtin" and isinstance(train, dict) and new != old:
        sizes = read_json(run_dir / BATCH) or {}  # after an OOM the micro-batch the job runs at now
        batch = int(sizes.get("batch_size") or train.get("batch_size") or 32)
        accumulate = int(sizes.get("accumulate_grad_batches") or train.get("accumulate_grad_batches") or 1)
        if (accumulate * old) % new:
            raise UsageError(
                f"orch retry --gpus {gpus}: job {job.id}'s effective batch is {batch * accumulate * old} (batch {batch} x "
                f"accumulate {accumulate} x {old} GPU(s)); {new} GPU(s) cannot keep it (use a number that divides {accumulate * old})"
            )
        spec_acc = int(train.get("accumulate_grad_batches") or 1)
        if (spec_acc * old) % new == 0:
            train["accumulate_grad_batches"] = spec_acc * old // new
    spec["gpus"] = gpus
    return spec
