"""What a built-in job's model holds, counted on the meta device (no weights read or allocated):
its parameters, those that train (all of them, or LoRA's adapters) and the bytes of the frozen rest
as loaded, for `orch estimate`'s memory per rank (orchestrator/planning/rank_memory.py)."""

from __future__ import annotations

from typing import Any, Optional

from orchestrator.spec.jobspec import TASK_CAUSAL_LM, TASK_CLASSIFY, TASK_TOKENS, JobSpec


def parameter_counts(spec: JobSpec) -> Optional[dict[str, int]]:
    """{"params", "trainable_params", "frozen_bytes"}, or None when the model cannot be built here."""
    assert spec.model is not None
    import torch
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(spec.model.name_or_path, local_files_only=True)
    except Exception:  # not on this machine: the estimate says memory is unknown
        return None
    auto = {
        TASK_CLASSIFY: transformers.AutoModelForSequenceClassification,
        TASK_TOKENS: transformers.AutoModelForTokenClassification,
        TASK_CAUSAL_LM: transformers.AutoModelForCausalLM,
    }[spec.model.task]
    if spec.model.num_labels and spec.model.task != TASK_CAUSAL_LM:
        config.num_labels = spec.model.num_labels
    # as the runner loads it: float32 to train in full; a LoRA base in its checkpoint's dtype
    from training.builtin.tasks import dtype_argument

    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) if spec.lora is not None else None
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    try:
        with torch.device("meta"):
            model: Any = auto.from_config(config, **dtype_argument(dtype or torch.float32))
            if spec.lora is not None:
                from training.builtin.tasks.lora import apply_lora

                model = apply_lora(model, spec.lora, gradient_checkpointing=False)
    except Exception:  # an architecture this transformers cannot build: the run finds out
        return None
    params = list(model.parameters())
    return {
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
        "frozen_bytes": sum(p.numel() * p.element_size() for p in params if not p.requires_grad),
    }


def peak_gpu_bytes() -> Optional[int]:
    """The most GPU memory this process's tensors held (rank 0's, in a multi-GPU probe), or None
    without CUDA."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.max_memory_allocated())
