"""The probe's count of a model's parameters on the meta device (training/ahead/param_count.py) is
the count of the model the runner trains: the whole model in full fine-tuning, LoRA's adapters
trained and the frozen base at its bytes as loaded."""

from __future__ import annotations

from orchestrator.spec.jobspec import spec_from_dict
from training.ahead.param_count import parameter_counts
from training.toy import write_jsonl
from training.toys.lm_and_ner import build_tiny_llama, instruction_rows


def test_parameter_counts_match_the_built_model_with_and_without_lora(tmp_path):
    import transformers

    from training.builtin.tasks.lora import apply_lora

    rows = instruction_rows(16, seed=1)
    llama = build_tiny_llama(tmp_path / "llama", [r["prompt"] + r["response"] for r in rows], vocab_size=300)
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    base = {
        "name": "x",
        "gpus": 0,
        "model": {"name_or_path": str(llama), "task": "causal-lm"},
        "data": {"train": str(data), "prompt_field": "prompt", "response_field": "response"},
        "train": {"max_epochs": 1},
    }
    real = transformers.AutoModelForCausalLM.from_pretrained(str(llama))
    total = sum(p.numel() for p in real.parameters())
    assert parameter_counts(spec_from_dict(base, "x")) == {
        "params": total,
        "trainable_params": total,
        "frozen_bytes": 0,
    }

    spec = spec_from_dict(dict(base, lora={"r": 4}), "x")
    peft = apply_lora(real, spec.lora, gradient_checkpointing=False)
    trained = [p for p in peft.parameters() if p.requires_grad]
    frozen = [p for p in peft.parameters() if not p.requires_grad]
    assert parameter_counts(spec) == {
        "params": sum(p.numel() for p in peft.parameters()),
        "trainable_params": sum(p.numel() for p in trained),
        "frozen_bytes": sum(p.numel() * p.element_size() for p in frozen),
    }


def test_a_model_not_on_this_machine_is_not_counted(tmp_path):
    data = write_jsonl(tmp_path / "t.jsonl", [{"text": "a", "label": 0}])
    spec = spec_from_dict(
        {
            "name": "x",
            "gpus": 0,
            "model": {"name_or_path": str(tmp_path / "absent")},
            "data": {"train": str(data)},
            "train": {"max_epochs": 1},
        },
        "x",
    )
    assert parameter_counts(spec) is None
