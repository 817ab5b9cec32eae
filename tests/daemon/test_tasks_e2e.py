"""causal-lm (LoRA) and token-classification through the real daemon, as the classifier is in
test_preemption_e2e.py: a notice at a random step resumes to weights torch.equal to an
uninterrupted run (LoRA: the adapter's) with 0 steps lost; a SIGKILL resumes from the newest
periodic checkpoint. Also what each task exports: the LoRA adapter loads with
PeftModel.from_pretrained and generates, the merged model gives base + adapter's logits, a LoRA
checkpoint holds only adapter tensors, and the NER model predicts tag names."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from daemon_harness import wait_for

import test_preemption_e2e as e2e
from metrics_rows import assert_same_metrics
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.home.wake import poke

pytestmark = pytest.mark.slow

ROWS, BATCH, EPOCHS = 160, 8, 2
STEPS_PER_EPOCH = ROWS // BATCH  # 20
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS  # 40
EVERY = 25
TASKS = ("sft-lora", "ner")


@pytest.fixture(scope="module")
def workloads(tmp_path_factory) -> dict[str, dict[str, Any]]:
    from training.toy import build_tiny_bert, write_jsonl
    from training.toys.lm_and_ner import build_tiny_llama, instruction_rows, ner_rows

    root = tmp_path_factory.mktemp("task-workloads")
    texts = [r["prompt"] + r["response"] for r in instruction_rows(400, seed=1)]
    llama = build_tiny_llama(root / "tiny-llama", texts, vocab_size=400)
    bert = build_tiny_bert(
        root / "tiny-bert",
        [" ".join(r["tokens"]) for r in ner_rows(600, seed=1)],
        hidden=32,
        layers=2,
        heads=2,
        vocab_size=120,
        max_positions=64,
    )
    common = {"hf_cache": root / "hf-cache", "root": root}
    return {
        "sft-lora": {
            **common,
            "model": {"name_or_path": str(llama), "task": "causal-lm"},
            "data": {
                "train": str(write_jsonl(root / "sft.jsonl", instruction_rows(ROWS, seed=11))),
                "validation": str(write_jsonl(root / "sft-dev.jsonl", instruction_rows(32, seed=12))),
                "prompt_field": "prompt",
                "response_field": "response",
                "max_length": 48,
            },
            "lora": {"r": 4, "alpha": 8, "dropout": 0.1, "merge": True},
            "lr": 5e-3,
        },
        "ner": {
            **common,
            "model": {"name_or_path": str(bert), "task": "token-classification"},
            "data": {
                "train": str(write_jsonl(root / "ner.jsonl", ner_rows(ROWS, seed=11))),
                "validation": str(write_jsonl(root / "ner-dev.jsonl", ner_rows(48, seed=12))),
                "max_length": 48,
            },
            "lr": 3e-3,
        },
    }


def submit_task(h, workload: dict[str, Any], name: str) -> int:
    spec: dict[str, Any] = {
        "name": name,
        "gpus": 0,
        "retries": 2,
        "grace_seconds": 30,
        "model": workload["model"],
        "data": {**workload["data"], "num_workers": 0, "shuffle": True},
        "train": {
            "max_epochs": EPOCHS,
            "batch_size": BATCH,
            "precision": "32",
            "learning_rate": workload["lr"],
            "seed": 7,
        },
        "checkpoint": {"every_n_steps": EVERY, "keep": 2},
        "env": {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(workload["hf_cache"]),
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "ORCH_PROGRESS_EVERY_S": str(e2e.PROGRESS_EVERY_S),
            "ORCH_FAULT_SLOW_STEP_S": str(e2e.SLOW_STEP_S),
        },
    }
    if "lora" in workload:
        spec["lora"] = workload["lora"]
    path = h.jobs_dir / f"{name}.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    job = submit_job(h.store, h.config, h.home, path, now=time.time(), machine_gpus=0)
    poke(h.home.wake_socket)
    return job.id


def trained_weights(run_dir: Path, task: str) -> dict[str, Any]:
    """What training changed, as exported: the adapter for LoRA, the whole model otherwise."""
    from safetensors.torch import load_file

    name = "adapter_model.safetensors" if task == "sft-lora" else "model.safetensors"
    return load_file(str(run_dir / "model" / name))


@pytest.fixture(scope="module")
def uninterrupted(workloads, tmp_path_factory) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for task in TASKS:
        h = e2e.make_home(tmp_path_factory.mktemp(f"straight-{task}") / "a")
        try:
            h.start_daemon()
            job_id = submit_task(h, workloads[task], "a")
            e2e.wait_succeeded(h, job_id, timeout=240)
            data = e2e.show(h, job_id)
            assert [a["outcome"] for a in data["attempts"]] == ["succeeded"], data["attempts"]
            assert data["result"]["steps"] == TOTAL_STEPS
            run_dir = h.run_dir(job_id)
            runs[task] = {"weights": trained_weights(run_dir, task), "show": data, "run_dir": run_dir, "keep": h}
        except BaseException:
            h.cleanup()
            raise
    yield runs
    for run in runs.values():
        run["keep"].cleanup()


@pytest.mark.parametrize("task", TASKS)
def test_notice_at_a_random_step_resumes_to_identical_weights_with_no_steps_lost(
    task, workloads, uninterrupted, homes, tmp_path
):
    rng = random.Random()
    notice_after = rng.choice([s for s in range(2, TOTAL_STEPS - 6) if s % EVERY and s % STEPS_PER_EPOCH])
    print(f"notice once progress shows step {notice_after}")
    h = e2e.make_home(tmp_path / "b", sources=["file"], poll_seconds=0.2, on_notice="wait")
    homes.append(h)
    sentinel = h.root / "preempt-notice"
    h.start_daemon()
    job_id = submit_task(h, workloads[task], "b")

    wait_for(
        lambda: e2e.progress_step(h, job_id) >= notice_after,
        120,
        interval=0.02,
        what=f"step {notice_after} of attempt 1",
    )
    sentinel.touch()
    wait_for(
        lambda: h.state(job_id).value == "queued",
        40,
        interval=0.05,
        what=f"the notice to requeue the job: {e2e.attempt_log(h, job_id, 1)}",
    )
    sentinel.unlink()
    e2e.wait_succeeded(h, job_id, timeout=240)

    data = e2e.show(h, job_id)
    first, second = data["attempts"]
    notice_step = e2e.notice_checkpoint_step(h, job_id)
    assert first["outcome"] == "preempted" and first["exit_code"] == 75, first
    assert first["step_reached"] == notice_step >= notice_after, data["attempts"]
    assert second["resumed_from_step"] == notice_step
    assert data["steps_lost"] == 0
    assert data["result"]["steps"] == TOTAL_STEPS
    e2e.assert_same_weights(uninterrupted[task]["weights"], trained_weights(h.run_dir(job_id), task))
    assert_same_metrics(uninterrupted[task]["run_dir"], h.run_dir(job_id))


@pytest.mark.parametrize("task", TASKS)
def test_sigkill_resumes_from_the_newest_periodic_checkpoint(task, workloads, uninterrupted, homes, tmp_path):
    h = e2e.make_home(tmp_path / "b")
    homes.append(h)
    h.start_daemon()
    job_id = submit_task(h, workloads[task], "b")
    periodic = h.run_dir(job_id) / "checkpoints" / f"step-{EVERY:08d}.ckpt"
    wait_for(
        lambda: periodic.exists() and e2e.progress_step(h, job_id) >= EVERY + 3,
        120,
        interval=0.02,
        what=f"{periodic.name} and step {EVERY + 3}",
    )
    os.killpg(h.attempt_pids(job_id, 1)["job_pid"], signal.SIGKILL)
    e2e.wait_succeeded(h, job_id, timeout=240)

    data = e2e.show(h, job_id)
    first, second = data["attempts"]
    assert first["signal"] == signal.SIGKILL, first
    assert second["resumed_from_step"] == EVERY
    assert data["steps_lost"] == first["step_reached"] - EVERY > 0
    e2e.assert_same_weights(uninterrupted[task]["weights"], trained_weights(h.run_dir(job_id), task))
    assert_same_metrics(uninterrupted[task]["run_dir"], h.run_dir(job_id))


@pytest.fixture
def homes():
    made: list = []
    yield made
    for h in made:
        h.cleanup()


def test_lora_checkpoint_holds_only_adapter_tensors(uninterrupted, workloads):
    import torch

    run_dir = uninterrupted["sft-lora"]["run_dir"]
    ckpt = torch.load(run_dir / "checkpoints" / f"step-{TOTAL_STEPS:08d}.ckpt", map_location="cpu", weights_only=False)
    keys = list(ckpt["state_dict"])
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys), keys[:5]
    # the optimizer holds state for exactly those tensors (Adam's two moments each)
    state = ckpt["optimizer_states"][0]["state"]
    assert len(state) == len(keys) and all({"exp_avg", "exp_avg_sq"} <= set(s) for s in state.values())
    base = Path(workloads["sft-lora"]["model"]["name_or_path"]) / "model.safetensors"
    ckpt_bytes = (run_dir / "checkpoints" / f"step-{TOTAL_STEPS:08d}.ckpt").stat().st_size
    print(f"LoRA checkpoint {ckpt_bytes} bytes ({len(keys)} adapter tensors); base model {base.stat().st_size} bytes")
    assert ckpt_bytes < base.stat().st_size


def test_exported_adapter_loads_generates_and_the_merged_model_matches(uninterrupted, workloads):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = uninterrupted["sft-lora"]["run_dir"] / "model"
    base_path = workloads["sft-lora"]["model"]["name_or_path"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    inputs = tokenizer(
        "question : is this review positive or negative ? the plot was dull\nanswer :", return_tensors="pt"
    )
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), str(folder)).eval()
    base_only = AutoModelForCausalLM.from_pretrained(base_path).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(folder / "merged")).eval()
    with torch.no_grad():
        generated = with_adapter.generate(
            **inputs, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        adapter_logits = with_adapter(**inputs).logits
        merged_logits = merged(**inputs).logits
        base_logits = base_only(**inputs).logits
    assert generated.shape[1] > inputs["input_ids"].shape[1]
    print("generated:", tokenizer.decode(generated[0, inputs["input_ids"].shape[1] :]))
    assert torch.allclose(adapter_logits, merged_logits, atol=1e-5), (adapter_logits - merged_logits).abs().max()
    assert not torch.allclose(adapter_logits, base_logits, atol=1e-3)  # the adapter did change something


def test_ner_export_predicts_tag_names_and_reports_entity_f1(uninterrupted):
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    run = uninterrupted["ner"]
    metrics = run["show"]["result"]["metrics"]
    print(
        f"entity F1 on the tiny dev set: {metrics['val_f1']:.3f} (P {metrics['val_precision']:.3f}, "
        f"R {metrics['val_recall']:.3f})"
    )
    assert metrics["val_f1"] >= 0.5  # about 0.87 on the CPU: the spans are being learned
    folder = run["run_dir"] / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForTokenClassification.from_pretrained(str(folder)).eval()
    words = ["john", "smith", "visited", "paris", "last", "week"]
    enc = tokenizer(words, is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        ids = model(**enc).logits.argmax(-1)[0].tolist()
    firsts = [i for i, w in enumerate(enc.word_ids()) if w is not None and (i == 0 or enc.word_ids()[i - 1] != w)]
    tags = [model.config.id2label[ids[i]] for i in firsts]
    print("predicted:", list(zip(words, tags)))
    assert len(tags) == len(words)
    assert set(model.config.id2label.values()) == {"O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"}
    assert all(t in model.config.label2id for t in tags)
    assert tags[0] == "B-PER" and tags[3] == "B-LOC", tags  # 'john ... paris'
