"""What each rank holds, in words (`orch show`) and in bytes (`orch estimate`), from the one
definition in planning/rank_memory.py: ddp a whole copy per rank, fsdp 1/N, cpu_offload in host
memory, LoRA's frozen base at its bytes as loaded and 16 bytes per trained parameter."""

from __future__ import annotations

import pytest

from orchestrator.planning.rank_memory import memory_text, rank_holds, rank_memory
from orchestrator.views.estimate import estimate_text

P = 1_000_000  # trained parameters


def spec(strategy: str = "ddp", **train: object) -> dict:
    return {
        "model": {"name_or_path": "m"},
        "data": {"train": "t"},
        "train": {"strategy": strategy, "batch_size": 8, **train},
    }


@pytest.mark.parametrize(
    "job, gpus, frozen, expected",
    [
        # (spec, gpus, frozen bytes) -> (weights, gradients, optimizer, on the GPU, in host memory) per rank
        (spec(), 1, 0, (4 * P, 4 * P, 8 * P, 16 * P, 0)),
        (spec(), 4, 0, (4 * P, 4 * P, 8 * P, 16 * P, 0)),
        (spec("fsdp"), 4, 0, (P, P, 2 * P, 4 * P, 0)),
        (spec("fsdp", cpu_offload=True), 4, 0, (P, P, 2 * P, 0, 4 * P)),
        (spec("fsdp"), 1, 0, (4 * P, 4 * P, 8 * P, 16 * P, 0)),  # one process: nothing to shard over
        # LoRA: a 2 GB bf16 base frozen, P adapter parameters trained
        (spec(), 2, 2 * 10**9, (2 * 10**9 + 4 * P, 4 * P, 8 * P, 2 * 10**9 + 16 * P, 0)),
        (spec("fsdp"), 2, 2 * 10**9, (10**9 + 2 * P, 2 * P, 4 * P, 10**9 + 8 * P, 0)),
    ],
)
def test_each_rank_holds_its_share_of_weights_gradients_and_optimizer_state(job, gpus, frozen, expected):
    m = rank_memory(job, gpus, trainable_params=P, frozen_bytes=frozen)
    got = (m["weights_bytes"], m["grads_bytes"], m["optimizer_bytes"], m["on_gpu_bytes"], m["on_host_bytes"])
    assert got == expected
    assert m["state_bytes"] == m["weights_bytes"] + m["grads_bytes"] + m["optimizer_bytes"]
    assert m["activation_bytes"] is None


def test_activations_are_the_probes_gpu_peak_less_the_states():
    m = rank_memory(spec("fsdp"), 2, trainable_params=P, frozen_bytes=0, peak_gpu_bytes=20 * P)
    assert m["on_gpu_bytes"] == 8 * P and m["activation_bytes"] == 12 * P
    assert "activations of a micro-batch of 8: 12 MB (the probe's peak less the states)" in memory_text(m)


def test_show_and_estimate_say_the_same_of_what_each_rank_holds():
    job = spec("fsdp", cpu_offload=True)
    words = rank_holds(job, 2)
    assert words.startswith("fsdp: each of 2 ranks holds 1/2 of the parameters") and "cpu_offload" in words
    m = rank_memory(job, 2, trainable_params=P, frozen_bytes=0)
    d = {
        "job": "big",
        "gpus": 2,
        "currency": "CNY",
        "hourly_rate": 1.0,
        "kind": "builtin",
        "steps_per_s": 1.0,
        "probe": {"measured_steps": 3, "warmup_steps": 1, "seconds": 5.0, "cost": 0.01},
        "total_steps": 10,
        "wall_s": 10.0,
        "parts_s": {"startup": 1.0, "training": 9.0, "eval": 0.0, "checkpoint": 0.0},
        "evals": 0,
        "saves": 1,
        "early_stopping": False,
        "cost": 0.01,
        "gpu_hours": 0.01,
        "checkpoint_interval_s": 60.0,
        "checkpoint_interval_why": "every 60 s",
        "checkpoint_stall_s": 0.1,
        "preemption_waste_s": 0.0,
        "preemption_waste_cost": 0.0,
        "mtbf_s": 3600.0,
        "mtbf_source": "assumed",
        "queue_wait_s": 0.0,
        "queue_wait_is_lower_bound": False,
        "queue_ahead": 0,
        "daemon_running": True,
        "ranks": words,
        "memory": m,
    }
    text = estimate_text(d)
    assert f"  ranks:       {words}" in text
    assert (
        "  memory:      per rank (2 ranks, fsdp, 1/2 each): weights 2 MB + gradients 2 MB + optimizer state 4 MB = 8 MB "
        "in host memory (cpu_offload); on the GPU only the block being computed and the activations; "
        "activations of a micro-batch of 8: not measured (the probe measures them on a GPU)"
    ) in text
    assert rank_holds(spec(), 1) == "" and rank_holds(spec(), 2).startswith(
        "ddp: each of 2 ranks holds the whole model"
    )
