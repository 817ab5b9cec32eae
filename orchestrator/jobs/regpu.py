"""A job resumed on another number of GPUs: `orch retry ID --gpus N`, `orch adopt … --gpus N`, and an
adoption onto a machine with fewer GPUs than the job asks for when its job.toml allows it
(`min_gpus`). The built-in runner reshards its checkpoint and keeps the effective batch
(micro-batch x accumulation x ranks) by changing the accumulation; when no whole accumulation keeps
it, the move is refused here, in one line. One rule for all three callers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping, Optional

from ..contract import BATCH, read_json
from ..model.errors import UsageError
from ..model.records import Job


def regpu_spec(job: Job, run_dir: Path, gpus: int) -> dict[str, Any]:
    """`orch retry --gpus`: the job's spec on `gpus` GPUs, or UsageError."""
    # after an OOM the micro-batch the job runs at now is in batch.json, not in the spec
    return resized_spec(
        job.spec,
        kind=job.kind,
        old_gpus=job.gpus,
        gpus=gpus,
        sizes=read_json(run_dir / BATCH),
        who=f"job {job.id}",
        command="orch retry",
    )


def resized_spec(
    spec: Mapping[str, Any],
    *,
    kind: str,
    old_gpus: int,
    gpus: int,
    sizes: Optional[Mapping[str, Any]],
    who: str,
    command: str,
) -> dict[str, Any]:
    """`spec` on `gpus` GPUs (its accumulation adjusted for a built-in job), or UsageError naming
    `who` and the `command` typed. `sizes`: batch.json's micro-batch and accumulation after an OOM."""
    out = copy.deepcopy(dict(spec))
    if int(out.get("nodes") or 1) > 1:
        raise UsageError(
            f"{command} --gpus: {who} runs on {out['nodes']} nodes; --gpus changes one machine's GPUs only"
        )
    problem = batch_problem(out, kind=kind, old_gpus=old_gpus, gpus=gpus, sizes=sizes)
    if problem:
        raise UsageError(f"{command} --gpus {gpus}: {who}'s {problem}")
    old, new = max(1, int(old_gpus)), max(1, gpus)
    train = out.get("train")
    if kind == "builtin" and isinstance(train, dict) and new != old:
        spec_acc = int(train.get("accumulate_grad_batches") or 1)
        if (spec_acc * old) % new == 0:
            train["accumulate_grad_batches"] = spec_acc * old // new
    out["gpus"] = gpus
    if out.get("min_gpus") is not None and int(out["min_gpus"]) > gpus:
        out["min_gpus"] = gpus  # asked for explicitly: the floor follows (the file must stay valid)
    return out


def batch_problem(
    spec: Mapping[str, Any], *, kind: str, old_gpus: int, gpus: int, sizes: Optional[Mapping[str, Any]]
) -> Optional[str]:
    """Why `gpus` GPUs cannot keep a built-in job's effective batch (a phrase), or None."""
    train = spec.get("train")
    old, new = max(1, int(old_gpus)), max(1, gpus)
    if kind != "builtin" or not isinstance(train, dict) or new == old:
        return None
    sizes = sizes or {}
    batch = int(sizes.get("batch_size") or train.get("batch_size") or 32)
    accumulate = int(sizes.get("accumulate_grad_batches") or train.get("accumulate_grad_batches") or 1)
    if (accumulate * old) % new == 0:
        return None
    return (
        f"effective batch is {batch * accumulate * old} (batch {batch} x accumulate {accumulate} x {old} GPU(s)); "
        f"{new} GPU(s) cannot keep it (use a number that divides {accumulate * old})"
    )


def fewer_gpus_allowed(
    spec: Mapping[str, Any], *, kind: str, old_gpus: int, available: int, sizes: Optional[Mapping[str, Any]]
) -> tuple[Optional[int], str]:
    """A job asking for more GPUs than a machine has (`available`): the most it may resume on there
    as its `min_gpus` allows, keeping the effective batch — (count, "") — or (None, why not)."""
    floor = spec.get("min_gpus")
    if floor is None:
        return None, f"it asks for {old_gpus} GPUs and sets no min_gpus (job.toml) to resume on fewer"
    if available < int(floor):
        return None, f"it asks for {old_gpus} GPUs (at least {floor}, min_gpus) and this machine has {available}"
    for n in range(available, int(floor) - 1, -1):
        if batch_problem(spec, kind=kind, old_gpus=old_gpus, gpus=n, sizes=sizes) is None:
            return n, ""
    return None, (
        f"no GPU count from {floor} (min_gpus) to {available} (this machine's) keeps its effective batch: "
        f"{batch_problem(spec, kind=kind, old_gpus=old_gpus, gpus=available, sizes=sizes)}"
    )
