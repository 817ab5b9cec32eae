"""What each rank of a built-in job holds: the one definition `orch show` words (rank_holds) and
`orch estimate` sizes (rank_memory), so the two never tell a job's memory two ways.

AdamW on a trained parameter costs 16 bytes: its float32 weight, its float32 gradient and two
float32 moments (under "16-mixed"/"bf16-mixed" Lightning and FSDP keep float32 weights and compute
in half precision). A frozen parameter (LoRA's base) costs its bytes as loaded. Under ddp every rank
holds all of it; under fsdp each of N ranks 1/N, plus one block's full parameters while it is
gathered; with cpu_offload those shards wait in host memory and only the gathered block and the
activations are on the GPU."""

from __future__ import annotations

from typing import Any, Optional

WEIGHT = GRADIENT = 4  # bytes of a float32 weight / gradient of a trained parameter
OPTIMIZER = 8  # AdamW's two float32 moments


def ranks_of(spec: dict[str, Any], gpus: int) -> int:
    return int(gpus or 0) * int(spec.get("nodes") or 1)


def is_sharded(spec: dict[str, Any], gpus: int) -> bool:
    return ranks_of(spec, gpus) > 1 and (spec.get("train") or {}).get("strategy") == "fsdp"


def rank_holds(spec: dict[str, Any], gpus: int) -> str:
    """What each rank of a multi-GPU built-in job holds ([train] strategy), in words; "" for one process."""
    ranks = ranks_of(spec, gpus)
    if ranks < 2:
        return ""
    if is_sharded(spec, gpus):
        where = "host memory (cpu_offload)" if (spec.get("train") or {}).get("cpu_offload") else "its GPU"
        return (
            f"fsdp: each of {ranks} ranks holds 1/{ranks} of the parameters, gradients and optimizer state "
            f"in {where}; checkpoints are sharded folders"
        )
    return f"ddp: each of {ranks} ranks holds the whole model, its gradients and optimizer state"


def rank_memory(
    spec: dict[str, Any],
    gpus: int,
    *,
    trainable_params: int,
    frozen_bytes: int,
    peak_gpu_bytes: Optional[int] = None,
) -> dict[str, Any]:
    """One rank's bytes: weights, gradients and optimizer state (their sum, `state_bytes`), where
    they are (`on_gpu_bytes`, `on_host_bytes`), and the activations of one micro-batch when a probe
    on a GPU measured its peak (the peak less what the states hold there; None otherwise)."""
    ranks = max(1, ranks_of(spec, gpus))
    sharded = is_sharded(spec, gpus)
    share = ranks if sharded else 1
    train = spec.get("train") or {}
    offload = sharded and bool(train.get("cpu_offload"))
    weights = (frozen_bytes + trainable_params * WEIGHT) / share
    grads = trainable_params * GRADIENT / share
    optimizer = trainable_params * OPTIMIZER / share
    state = weights + grads + optimizer
    on_gpu = 0.0 if offload else state
    activations = None if peak_gpu_bytes is None else max(0.0, peak_gpu_bytes - on_gpu)
    return {
        "strategy": "fsdp" if sharded else ("ddp" if ranks > 1 else "one process"),
        "ranks": ranks,
        "share": share,
        "cpu_offload": offload,
        "micro_batch": int(train.get("batch_size") or 32),
        "weights_bytes": round(weights),
        "grads_bytes": round(grads),
        "optimizer_bytes": round(optimizer),
        "state_bytes": round(state),
        "on_gpu_bytes": round(on_gpu),
        "on_host_bytes": round(state - on_gpu),
        "activation_bytes": None if activations is None else round(activations),
    }


def format_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def memory_text(m: dict[str, Any]) -> str:
    """`orch estimate`'s memory line (after "memory:")."""
    who = {"fsdp": f"fsdp, 1/{m['share']} each", "ddp": "ddp, a whole copy each"}.get(m["strategy"], "one process")
    ranks = f"per rank ({m['ranks']} ranks, {who})" if m["ranks"] > 1 else "the process"
    parts = (
        f"weights {format_bytes(m['weights_bytes'])} + gradients {format_bytes(m['grads_bytes'])} + "
        f"optimizer state {format_bytes(m['optimizer_bytes'])} = {format_bytes(m['state_bytes'])}"
    )
    if m["cpu_offload"]:
        where = " in host memory (cpu_offload); on the GPU only the block being computed and the activations"
    else:
        where = " on the GPU" + (
            "; plus one block's full parameters while it is gathered" if m["strategy"] == "fsdp" else ""
        )
    acts = m.get("activation_bytes")
    act = (
        f"; activations of a micro-batch of {m['micro_batch']}: {format_bytes(acts)} (the probe's peak less the states)"
        if acts is not None
        else f"; activations of a micro-batch of {m['micro_batch']}: not measured (the probe measures them on a GPU)"
    )
    return f"{ranks}: {parts}{where}{act}"
