"""[train] strategy = "fsdp": FSDP2 over two CPU ranks (gloo, ORCH_GPUS_ON_CPU=1) on a tiny
Llama built here; sharded checkpoints (one folder each, complete only once renamed into place),
exact resume after a notice, resume from the newest complete folder after a SIGKILL, and the
export gathered onto rank 0 that from_pretrained loads."""

from __future__ import annotations

import random
import shutil
import signal
from pathlib import Path

import pytest

from training.resume.checkpoints import list_checkpoints, step_of
from training.toy import write_jsonl
from training.toys.lm_and_ner import build_tiny_llama, instruction_rows

from conftest import assert_same_weights, final_weights, read_progress, read_result, wait_for
from metrics_rows import assert_same_metrics

pytestmark = pytest.mark.slow

CPU = {"ORCH_GPUS_ON_CPU": "1", "CUDA_VISIBLE_DEVICES": ""}
ROWS, BATCH = 96, 8  # 2 ranks: 48 rows each, 6 steps per epoch


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp-sft")
    rows = instruction_rows(ROWS, seed=31)
    train = write_jsonl(folder / "sft.jsonl", rows)
    dev = write_jsonl(folder / "dev.jsonl", instruction_rows(16, seed=32))
    llama = build_tiny_llama(folder / "llama", [r["prompt"] + r["response"] for r in rows], vocab_size=300)
    return llama, train, dev


def sft_job(make_run_dir, sft, name: str, lora=None, validation: bool = True, **train):
    llama, data, dev = sft
    return make_run_dir(
        name,
        lora=lora,
        gpus=2,
        model={"name_or_path": str(llama), "task": "causal-lm", "num_labels": None},
        data={
            "train": str(data),
            "validation": str(dev) if validation else None,
            "prompt_field": "prompt",
            "response_field": "response",
            "max_length": 96,
            "packing": False,
        },
        train={"max_epochs": 2, "batch_size": BATCH, "strategy": "fsdp", "learning_rate": 1e-3, **train},
        checkpoint={"every_n_steps": 4, "keep": 2},
    )


def straight_run(make_run_dir, run_job, sft, name: str, **overrides) -> Path:
    """An uninterrupted 2-rank run to compare with."""
    straight = sft_job(make_run_dir, sft, name, **overrides)
    code, out = run_job(straight, timeout=600, **CPU)
    assert code == 0, out
    assert "fsdp: 2 rank(s)" in out
    ckpts = list_checkpoints(straight / "checkpoints")
    assert ckpts and all(p.is_dir() for p in ckpts), ckpts  # sharded: one folder per checkpoint
    assert (ckpts[0] / "__0_0.distcp").is_file() and (ckpts[0] / "__1_0.distcp").is_file()
    return straight


def test_fsdp_notice_resumes_to_identical_weights_and_metrics(make_run_dir, start_job, run_job, sft):
    straight = straight_run(make_run_dir, run_job, sft, "straight")
    # the export is the whole model, gathered on rank 0: transformers loads it as it is
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(straight / "model"))

    run = sft_job(make_run_dir, sft, "interrupted")
    stop_at = random.Random().randint(2, 10)
    job = start_job(run, attempt=1, ORCH_PROGRESS_EVERY_S="0.1", ORCH_FAULT_SLOW_STEP_S="0.3", **CPU)
    wait_for(lambda: (read_progress(run) or {}).get("step", 0) >= stop_at, 120, f"step {stop_at}")
    job.signal_group(signal.SIGTERM)
    code = job.wait(timeout=60)
    assert code == 75, job.output()
    notices = [p for p in list_checkpoints(run / "checkpoints") if p.name.startswith("notice-")]
    assert len(notices) == 1 and notices[0].is_dir(), job.output()

    code, out = run_job(run, attempt=2, timeout=600, **CPU)
    assert code == 0, out
    assert f"resuming from {notices[0].name}" in out
    assert read_result(run)["steps"] == read_result(straight)["steps"]
    assert_same_weights(final_weights(straight), final_weights(run))
    assert_same_metrics(straight, run)


# No dropout: on another number of ranks each rank's RNG stream cannot be restored (they start from
# rank 0's), so dropout masks would differ; what is compared here is the resharded state and order.
LORA = {"r": 4, "dropout": 0.0, "merge": True}


def test_fsdp_lora_sigkill_resumes_from_newest_complete_folder_on_one_rank(make_run_dir, start_job, run_job, sft):
    """LoRA under FSDP, SIGKILL mid-run on 2 ranks (periodic saves in the background); a newer
    folder missing a shard is skipped for the newest complete one, which a 1-rank attempt
    (`orch retry --gpus 1`) reshards with the accumulation doubled: the same samples per optimizer
    step, the same steps, adapters within 1e-3; the export loads (adapter and merged model)."""
    straight = straight_run(make_run_dir, run_job, sft, "lora-straight", lora=LORA)
    run = sft_job(make_run_dir, sft, "killed", lora=LORA)
    job = start_job(run, attempt=1, ORCH_PROGRESS_EVERY_S="0.1", ORCH_FAULT_SLOW_STEP_S="0.3", **CPU)
    ckpts = run / "checkpoints"
    wait_for(lambda: (ckpts / "step-00000004.ckpt").is_dir(), 300, "the step-4 checkpoint")
    job.signal_group(signal.SIGKILL)
    job.wait(timeout=30)
    for extra in [p for p in list_checkpoints(ckpts) if step_of(p) != 4]:
        shutil.rmtree(extra)  # whatever the kill let through after step 4: resume from step 4
    torn = ckpts / "step-00000005.ckpt"  # a newer folder, one rank's shard lost
    shutil.copytree(ckpts / "step-00000004.ckpt", torn)
    (torn / "__1_0.distcp").unlink()

    text = (run / "job.toml").read_text()  # what `orch retry --gpus 1` writes: one GPU
    (run / "job.toml").write_text(text.replace("gpus = 2", "gpus = 1"))
    code, out = run_job(run, attempt=2, timeout=600, **CPU)
    assert code == 0, out
    assert "skipping checkpoint" in out and "step-00000005.ckpt" in out, out
    assert "resuming from step-00000004.ckpt" in out, out
    assert "written by 2 rank(s): resuming on 1 with batch 8 x accumulate 2" in out, out
    assert read_result(run)["steps"] == read_result(straight)["steps"]
    a, b = adapter_weights(straight), adapter_weights(run)
    assert a.keys() == b.keys() and a
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst < 1e-3, worst
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    AutoPeftModelForCausalLM.from_pretrained(str(run / "model"))
    AutoModelForCausalLM.from_pretrained(str(run / "model" / "merged"))


def adapter_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "adapter_model.safetensors"))


def test_fsdp_out_of_memory_halves_the_micro_batch_and_finishes(make_run_dir, run_job, sft):
    """An OOM under FSDP (injected above micro-batch 4 from step 5): exit 76, batch.json says 4 x 2,
    and the next attempt resumes from the last sharded checkpoint and runs the same steps."""
    import json

    run = sft_job(make_run_dir, sft, "oom")
    fault = {"ORCH_FAULT_OOM_ABOVE_BATCH": "4", "ORCH_FAULT_OOM_AT_STEP": "5"}
    code, out = run_job(run, attempt=1, timeout=600, **CPU, **fault)
    assert code == 76, out
    sizes = json.loads((run / "batch.json").read_text())
    assert (sizes["batch_size"], sizes["accumulate_grad_batches"]) == (4, 2)
    code, out = run_job(run, attempt=2, timeout=600, **CPU, **fault)
    assert code == 0, out
    assert "resuming from step-00000004.ckpt" in out, out
    assert read_result(run)["steps"] == 2 * ROWS // (BATCH * 2)


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of 8 MB for the checkpoints (skipped, with the reason, where mounting is not allowed)."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({(done.stderr or done.stdout).strip()}): needs root or CAP_SYS_ADMIN")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_during_a_sharded_save_writes_disk_full_and_keeps_the_previous_folder(
    make_run_dir, start_job, run_job, sft, small_fs
):
    """The disk fills up after the step-4 folder (a real tmpfs, a filler file): the step-8 save,
    written in the background, fails with ENOSPC; at the next save both ranks stop with one line,
    exit 1; disk_full.json names the bytes needed and free; no temp folder is left and step 4 stays
    complete, so once space is freed the next attempt resumes from it and finishes. (A synchronous
    save, notice or best, settles the same way at once: tests/training/test_sharded_full.py.)"""
    import os

    from orchestrator.reports.disk_full import disk_full
    from training.resume.sharded import folder_problem

    run = sft_job(
        make_run_dir, sft, "full", validation=False
    )  # no best checkpoint: the periodic saves, in the background
    ckpts = small_fs / "checkpoints"
    env = {"ORCH_CKPT_DIR": str(ckpts), "ORCH_PROGRESS_EVERY_S": "0.1", "ORCH_FAULT_SLOW_STEP_S": "0.3", **CPU}
    job = start_job(run, attempt=1, **env)
    wait_for(lambda: (ckpts / "step-00000004.ckpt").is_dir(), 300, "the step-4 folder")
    filler = small_fs / "filler"
    with open(filler, "wb") as fh:  # leave about 4 kB: DCP's shard files do not fit
        fh.write(b"\0" * max(0, shutil.disk_usage(small_fs).free - 4096))
        fh.flush()
        os.fsync(fh.fileno())
    code = job.wait(timeout=300)
    out = job.output()
    assert code == 1, out[-3000:]
    info = disk_full(run, 1)
    assert info is not None, out[-3000:]
    # step 8's save failed in the background; the step-12 save found it (and the ranks agreed)
    assert info["name"] == "step-00000008.ckpt" and info["previous"] == "step-00000004.ckpt", info
    assert info["needed_bytes"] > info["free_bytes"], info
    line = f"disk full: saving {info['name']} needed {info['needed_bytes'] / 1e6:.1f} MB but {ckpts} has"
    assert line in out and f"{info['previous']} is intact" in out and "Traceback" not in out, out[-3000:]
    left = sorted(p.name for p in ckpts.iterdir())
    assert "step-00000004.ckpt" in left and info["name"] not in left, left  # no temp folder, the old ones whole
    assert all(folder_problem(ckpts / name) is None for name in left), left
    filler.unlink()  # space back: `orch retry` resumes from the folder the full disk left
    code, out = run_job(run, attempt=2, timeout=600, **env)
    assert code == 0, out[-3000:]
    assert "resuming from step-00000004.ckpt" in out
    assert read_result(run)["steps"] == 2 * ROWS // (BATCH * 2)
