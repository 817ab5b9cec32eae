"""Out of GPU memory: exit 76, the next attempt runs at half the micro-batch and twice the
accumulation from the last periodic checkpoint, and the interrupted epoch sees every sample once.
The OOM is injected through ORCH_FAULT_OOM_ABOVE_BATCH (a real torch.cuda.OutOfMemoryError). The
two attempts of the accounting test run in this process (training.run.main, as `orch run` calls
it): what they train is the point; the batch-size-one case keeps the real process and its exits."""

from __future__ import annotations

import collections
import json

import pytest

from training.resume.resize import rescale_checkpoint, shrink
from training.toy import sentiment_rows, write_jsonl

from conftest import read_result

# 640 unique rows / batch 16 = 40 steps per epoch; periodic checkpoints every 10 steps.
OOM_AT_STEP = 25  # the checkpoint before it is step 20, mid-epoch 0


@pytest.fixture
def unique_train(tmp_path):
    rows = sentiment_rows(640, seed=21)
    words = [
        "movie",
        "film",
        "plot",
        "acting",
        "script",
        "soundtrack",
        "ending",
        "cast",
        "story",
        "dialogue",
        "pacing",
        "visuals",
    ]  # in the tiny tokenizer's vocabulary (digits are not)
    for i, row in enumerate(rows):
        tag = " ".join(words[(i // 12**k) % 12] for k in range(3))
        row["text"] = f"{row['text']} {tag}"  # no two rows alike: each one is countable
    return write_jsonl(tmp_path / "unique.jsonl", rows)


def rows_by_epoch(trace_lines, max_step=None):
    seen = collections.defaultdict(list)
    for line in trace_lines:
        if max_step is None or line["step"] < max_step:
            seen[line["epoch"]].extend(line["rows"])
    return seen


@pytest.mark.slow
def test_oom_halves_batch_keeps_effective_batch_and_accounts_every_sample(
    make_run_dir, run_here, unique_train, tmp_path
):
    run = make_run_dir(
        "oom",
        data={"train": str(unique_train)},
        train={"max_epochs": 2, "batch_size": 16},
        checkpoint={"every_n_steps": 10, "keep": 3},
    )
    trace1, trace2 = tmp_path / "trace1.jsonl", tmp_path / "trace2.jsonl"
    code, out = run_here(
        run,
        attempt=1,
        ORCH_FAULT_OOM_ABOVE_BATCH="8",
        ORCH_FAULT_OOM_AT_STEP=str(OOM_AT_STEP),
        ORCH_TRACE_SAMPLES=str(trace1),
    )
    assert code == 76, out
    sizes = json.loads((run / "batch.json").read_text())
    assert (sizes["batch_size"], sizes["accumulate_grad_batches"]) == (8, 2)
    assert sizes["history"][-1]["step"] == OOM_AT_STEP
    assert not (run / "result.json").exists()

    code, out = run_here(run, attempt=2, ORCH_FAULT_OOM_ABOVE_BATCH="8", ORCH_TRACE_SAMPLES=str(trace2))
    assert code == 0, out
    assert "resuming from step-00000020.ckpt" in out
    result = read_result(run)
    assert result["steps"] == 80  # same optimizer steps: the effective batch did not change
    assert result["batch_size"] == 8 and result["accumulate_grad_batches"] == 2

    first = [json.loads(x) for x in trace1.read_text().splitlines()]
    second = [json.loads(x) for x in trace2.read_text().splitlines()]
    assert max(len(x["rows"]) for x in second) == 8
    # What counts: attempt 1 up to the checkpoint it resumed from, then all of attempt 2.
    kept = rows_by_epoch(first, max_step=20)
    for epoch, rows in rows_by_epoch(second).items():
        kept[epoch].extend(rows)
    expected = collections.Counter(rows_by_epoch(first)[0])  # epoch 0 of attempt 1 is a full permutation prefix
    assert len(kept[0]) == 640, f"epoch 0 trained {len(kept[0])} samples, want 640"
    assert len(set(kept[0])) == 640, "a sample was repeated (or skipped) in the interrupted epoch"
    assert len(kept[1]) == 640 and len(set(kept[1])) == 640
    assert set(kept[0]) == set(kept[1])
    assert expected  # sanity: attempt 1 did train


def test_oom_at_batch_size_one_fails_with_a_clear_message(make_run_dir, run_job):
    run = make_run_dir("oom1", train={"batch_size": 2, "max_epochs": 1})
    code, out = run_job(run, attempt=1, ORCH_FAULT_OOM_ABOVE_BATCH="-1")
    assert code == 76, out
    assert json.loads((run / "batch.json").read_text())["batch_size"] == 1
    code, out = run_job(run, attempt=2, ORCH_FAULT_OOM_ABOVE_BATCH="-1")
    assert code == 1, out
    last = out.strip().splitlines()[-1]
    assert "out of GPU memory even at batch size 1" in last


@pytest.mark.parametrize(
    "batch, accumulate, expected",
    [
        (32, 1, (16, 2)),
        (16, 4, (8, 8)),
        (2, 1, (1, 2)),
        (1, 1, None),
        (3, 1, (1, 3)),
        (12, 1, (6, 2)),
        (15, 2, (5, 6)),  # odd: divide by the smallest prime factor
    ],
)
def test_shrink_keeps_the_effective_batch(batch, accumulate, expected):
    assert shrink(batch, accumulate) == expected
    if expected:
        assert expected[0] * expected[1] == batch * accumulate


def test_rescale_checkpoint_converts_batch_counters_not_sample_counters():
    ckpt = {
        "loops": {
            "fit_loop": {
                "epoch_loop.batch_progress": {
                    "total": {"ready": 45, "completed": 44, "started": 45, "processed": 45},
                    "current": {"ready": 5, "completed": 4, "started": 5, "processed": 5},
                    "is_last_batch": False,
                },
                "state_dict": {
                    "combined_loader": [
                        {
                            "_sampler_iter_state": {
                                "samples_yielded": 80,
                                "sampler_iter_state": {"epoch": 1, "yielded": 80},
                            },
                            "_sampler_iter_yielded": 5,
                            "_num_yielded": 5,
                        }
                    ]
                },
            }
        },
        "global_step": 45,
        "orch": {"batch_size": 16},
    }
    rescale_checkpoint(ckpt, 16, 8)
    fit = ckpt["loops"]["fit_loop"]
    assert fit["epoch_loop.batch_progress"]["current"] == {"ready": 10, "completed": 9, "started": 10, "processed": 10}
    loader = fit["state_dict"]["combined_loader"][0]
    assert loader["_num_yielded"] == 10 and loader["_sampler_iter_yielded"] == 10
    assert loader["_sampler_iter_state"]["samples_yielded"] == 80  # samples stay samples
    assert ckpt["global_step"] == 45 and ckpt["orch"]["batch_size"] == 8
