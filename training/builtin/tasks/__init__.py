"""[model] task -> the data module, the LightningModule, the default checkpoint monitor and the
export of each task. The runner (training/builtin/job.py) is the same for all three."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.spec.jobspec import TASK_CAUSAL_LM, TASK_CLASSIFY, TASK_TOKENS, JobSpec

from ..rows import usable_max_length

# best.ckpt's monitor when there is no [early_stopping]: what each task's validation is judged by.
DEFAULT_MONITOR = {
    TASK_CLASSIFY: ("val_acc", "max"),
    TASK_CAUSAL_LM: ("val_loss", "min"),
    TASK_TOKENS: ("val_f1", "max"),
}


def make_data(spec: JobSpec, tokenizer: Any, batch_size: int) -> Any:
    assert spec.model is not None and spec.data is not None and spec.train is not None
    d = spec.data
    common = dict(
        tokenizer=tokenizer,
        train=d.train,
        validation=d.validation,
        text_field=d.text_field,
        max_length=usable_max_length(d.max_length, tokenizer),
        batch_size=batch_size,
        num_workers=d.num_workers,
        shuffle=d.shuffle,
        seed=spec.train.seed,
    )
    if spec.model.task == TASK_CAUSAL_LM:
        from .causal_lm import CausalLMData

        return CausalLMData(
            prompt_field=d.prompt_field,
            response_field=d.response_field,
            messages_field=d.messages_field,
            packing=d.packing,
            **common,
        )
    if spec.model.task == TASK_TOKENS:
        from .token_cls import TokenClassificationData

        return TokenClassificationData(tokens_field=d.tokens_field, tags_field=d.tags_field, **common)
    from ..data import TextClassificationData

    return TextClassificationData(
        text_pair_field=d.text_pair_field, label_field=d.label_field, num_labels=spec.model.num_labels, **common
    )


def make_module(spec: JobSpec, data: Any, num_labels: int, *, sharded: bool = False, **kwargs: Any) -> Any:
    """kwargs: what every task's module takes (learning rate, schedule, batch size, total steps).
    `sharded` (strategy = "fsdp"): every parameter in float32, the frozen base too, since FSDP2
    shards a block's parameters as one buffer of one dtype (its policy computes in bf16 on a GPU)."""
    assert spec.model is not None
    task, path, checkpointing = spec.model.task, spec.model.name_or_path, spec.model.gradient_checkpointing
    if task == TASK_CAUSAL_LM:
        import torch
        from transformers import AutoModelForCausalLM

        from .modules import CausalLMModule

        # LoRA: the frozen base stays in its checkpoint's dtype (a 7B model in bf16 is 14 GB, not
        # 28); the adapters peft adds are float32. Full fine-tuning: float32 weights for AdamW,
        # with [train] precision's autocast for the compute.
        lora_base = spec.lora is not None and not sharded
        model = AutoModelForCausalLM.from_pretrained(path, **dtype_argument("auto" if lora_base else torch.float32))
        if checkpointing:
            model.gradient_checkpointing_enable()
        if spec.lora is not None:
            from .lora import apply_lora

            model = apply_lora(model, spec.lora, gradient_checkpointing=checkpointing)
        return CausalLMModule(path, 1, model=model, adapters_only=spec.lora is not None, **kwargs)
    if task == TASK_TOKENS:
        from transformers import AutoModelForTokenClassification

        from .modules import TokenClassifierModule

        names = data.label_names
        # The head is new (sized to the tag set): a checkpoint with another head size is fine.
        model = AutoModelForTokenClassification.from_pretrained(
            path,
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
            ignore_mismatched_sizes=True,
        )
        return TokenClassifierModule(
            path, len(names), model=model, tag_names=names, gradient_checkpointing=checkpointing, **kwargs
        )
    from ..module import TransformerClassifier

    return TransformerClassifier(
        path, num_labels, gradient_checkpointing=checkpointing, label_names=data.label_names, **kwargs
    )


def dtype_argument(value: Any) -> dict[str, Any]:
    """from_pretrained's dtype argument under the name this transformers knows (dtype from 4.56)."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": value}


def export(spec: JobSpec, module: Any, tokenizer: Any, folder: Path, *, full_state: Any = None) -> None:
    """RUN_DIR/model: the trained model and tokenizer (LoRA: the adapter, and model/merged/).
    `full_state`: a sharded model's whole state dict, gathered onto this rank's CPU."""
    assert spec.model is not None
    if spec.lora is not None:
        from .lora import export_lora

        export_lora(
            module.model,
            tokenizer,
            folder,
            merge=spec.lora.merge,
            state_dict=full_state,
            base=spec.model.name_or_path if full_state is not None else None,
        )
        return
    folder.mkdir(parents=True, exist_ok=True)
    if full_state is not None:
        module.model.save_pretrained(str(folder), state_dict=full_state)
    else:
        module.model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
