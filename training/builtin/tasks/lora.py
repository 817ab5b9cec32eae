"""[lora] through peft: wrap the causal LM so only the adapters train, keep checkpoints to the
trained tensors, and export the adapter (and, with merge, the merged model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.exits import ConfigError


def apply_lora(model: Any, lora: Any, *, gradient_checkpointing: bool) -> Any:
    """The base model frozen, adapters on lora.target_modules (None: peft's default for the
    architecture). With gradient checkpointing the inputs must require grad, or no gradient
    reaches the adapters through the checkpointed (frozen) blocks."""
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
    )
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as exc:
        raise ConfigError(
            f'lora.target_modules: {str(exc).splitlines()[0]} (set lora.target_modules to module names, or "all-linear")'
        ) from None
    if gradient_checkpointing:
        wrapped.enable_input_require_grads()
    return wrapped


def trained_only(state_dict: dict[str, Any], module: Any) -> dict[str, Any]:
    """The entries of a LightningModule's state dict that training changes (the adapters): the
    frozen base is reloaded from model.name_or_path on resume, so the checkpoint stays small."""
    trained = {name for name, p in module.named_parameters() if p.requires_grad}
    return {k: v for k, v in state_dict.items() if k in trained}


def export_lora(
    peft_model: Any, tokenizer: Any, folder: Path, *, merge: bool, state_dict: Any = None, base: Any = None
) -> None:
    """folder/: adapter_model.safetensors + adapter_config.json (PeftModel.from_pretrained onto the
    base) and the tokenizer; with merge, folder/merged/: a plain model (from_pretrained alone).
    A sharded model (strategy = "fsdp") gives its gathered `state_dict`, and is merged from a fresh
    copy of its `base` with the adapter just written (its own parameters are shards)."""
    folder.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(folder), **({"state_dict": state_dict} if state_dict is not None else {}))
    tokenizer.save_pretrained(str(folder))
    if merge:
        if base is not None:
            from peft import AutoPeftModelForCausalLM

            peft_model = AutoPeftModelForCausalLM.from_pretrained(str(folder))
        merged = peft_model.merge_and_unload()  # last use of the model: merging changes it in place
        merged.save_pretrained(str(folder / "merged"))
        tokenizer.save_pretrained(str(folder / "merged"))
