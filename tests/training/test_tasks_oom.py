"""Out of GPU memory during SFT (LoRA, loss on responses): exit 76, the next attempt runs at half
the micro-batch and twice the accumulation from the last periodic checkpoint, and every sample
is trained exactly once per epoch. The OOM is injected through ORCH_FAULT_OOM_ABOVE_BATCH; both
attempts run in this process (training.run.main), the exits through a real process being
test_training_oom.py's."""

from __future__ import annotations

import json

import pytest

from training.toy import write_jsonl
from training.toys.lm_and_ner import build_tiny_llama, instruction_rows

from conftest import read_result
from test_training_oom import rows_by_epoch

pytestmark = pytest.mark.slow

ROWS, BATCH = 192, 8  # 24 steps per epoch; periodic checkpoints every 10
OOM_AT_STEP = 15  # the checkpoint before it is step 10, mid-epoch 0


def test_sft_oom_halves_batch_keeps_effective_batch_and_trains_every_sample_once(make_run_dir, run_here, tmp_path):
    rows = instruction_rows(ROWS, seed=21)
    words = ["movie", "film", "plot", "acting", "script", "cast"]
    for i, row in enumerate(rows):  # no two prompts alike: each row is countable
        row["prompt"] = f"{' '.join(words[(i // 6**k) % 6] for k in range(3))} {row['prompt']}"
    train = write_jsonl(tmp_path / "sft.jsonl", rows)
    llama = build_tiny_llama(tmp_path / "llama", [r["prompt"] + r["response"] for r in rows], vocab_size=400)
    run = make_run_dir(
        "sft-oom",
        model={"name_or_path": str(llama), "task": "causal-lm", "num_labels": None},
        data={
            "train": str(train),
            "validation": None,
            "prompt_field": "prompt",
            "response_field": "response",
            "max_length": 64,
        },
        train={"max_epochs": 2, "batch_size": BATCH},
        lora={"r": 4, "dropout": 0.1},
        checkpoint={"every_n_steps": 10, "keep": 3},
    )
    trace1, trace2 = tmp_path / "trace1.jsonl", tmp_path / "trace2.jsonl"
    code, out = run_here(
        run,
        attempt=1,
        ORCH_FAULT_OOM_ABOVE_BATCH="4",
        ORCH_FAULT_OOM_AT_STEP=str(OOM_AT_STEP),
        ORCH_TRACE_SAMPLES=str(trace1),
    )
    assert code == 76, out
    sizes = json.loads((run / "batch.json").read_text())
    assert (sizes["batch_size"], sizes["accumulate_grad_batches"]) == (4, 2)
    assert sizes["history"][-1]["step"] == OOM_AT_STEP

    code, out = run_here(run, attempt=2, ORCH_FAULT_OOM_ABOVE_BATCH="4", ORCH_TRACE_SAMPLES=str(trace2))
    assert code == 0, out
    assert "resuming from step-00000010.ckpt" in out
    result = read_result(run)
    assert result["steps"] == 2 * ROWS // BATCH  # the same optimizer steps: the effective batch is unchanged
    assert (result["batch_size"], result["accumulate_grad_batches"]) == (4, 2)

    first = [json.loads(x) for x in trace1.read_text().splitlines()]
    second = [json.loads(x) for x in trace2.read_text().splitlines()]
    assert max(len(x["rows"]) for x in first) == BATCH and max(len(x["rows"]) for x in second) == 4
    kept = rows_by_epoch(first, max_step=10)  # attempt 1 up to the checkpoint resumed from, then attempt 2
    for epoch, seen in rows_by_epoch(second).items():
        kept[epoch].extend(seen)
    for epoch in (0, 1):
        assert len(kept[epoch]) == ROWS and len(set(kept[epoch])) == ROWS, (
            f"epoch {epoch}: {len(kept[epoch])} samples trained, {len(set(kept[epoch]))} distinct; want {ROWS} once each"
        )
    assert set(kept[0]) == set(kept[1])
