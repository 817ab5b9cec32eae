"""Sharded checkpoints (strategy = "fsdp") against bare torch.distributed.checkpoint, on the same
FSDP2 model and optimizer state, in one run: arms alternated round by round after a warm-up round.

  save:  orch's notice save (shard_state, a temp folder, dcp.save, meta.pt, fsync of every file,
         rename; training/resume/sharded.py) ÷ a bare dcp.save of get_state_dict  (goal ≤ 1.2)
  load:  orch's resume (load_shards + meta.pt) ÷ a bare dcp.load + set_state_dict  (goal ≤ 1.2)
  stall: the step blocked by a periodic save in the background (DCP's async save, as the sharded
         strategy runs it) ÷ a synchronous save of the same state  (goal ≤ 0.25)

With --throughput instead: training samples/s of a built-in causal-LM job (`python -m
training.run`, strategy = "fsdp", first step to last) ÷ a plain FSDP2 script of the same model,
data, micro-batch and steps (goal ≥ 0.97), the two alternated --rounds times.

Every arm's time is the slowest rank's (what the step waits for). Runs on the CPU with gloo (two
processes) by default; on GPUs with NCCL when --device cuda.

    python -m benchmarks.fsdp [--ranks 2] [--hidden 512] [--layers 8] [--rounds 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from .common import REPO


def build(args, device):
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=8000,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config)
    mesh = torch.distributed.device_mesh.init_device_mesh(device.type, (args.ranks,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 8000, (2, 64), device=device)
    model(input_ids=ids, labels=ids).loss.backward()  # AdamW's state exists: a real checkpoint's size
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def timed(fn) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    fn()
    took = time.perf_counter() - start
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, took)
    return max(float(t) for t in gathered)


def worker(rank: int, args, folder: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from training.resume.sharded import commit_folder, load_meta, load_shards, prepare_folder, shard_state

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK=str(rank), WORLD_SIZE=str(args.ranks))
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=args.ranks)
    save_group = dist.new_group(backend="gloo")
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    cuda = args.device == "cuda"
    stager = DefaultStager(StagingOptions(cuda, False, False, False))  # as ShardedStrategy keeps one
    model, optimizer = build(args, device)
    root = Path(folder)
    meta = {"loops": {"fit_loop": {"state_dict": {}}}, "lr_schedulers": [{"last_epoch": 1}], "orch": {"world_size": 2}}

    def orch_save(name: str) -> None:
        path = root / name
        state = shard_state(model, [optimizer], trained_only=False)
        temp = prepare_folder(path) if rank == 0 else None
        dist.barrier()
        box = [str(temp)]
        dist.broadcast_object_list(box, src=0)
        dcp.save(state, checkpoint_id=box[0])
        if rank == 0:
            commit_folder(Path(box[0]), path, dict(meta))
        dist.barrier()

    def bare_save(name: str) -> None:
        msd, osd = get_state_dict(model, optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(root / name))

    pending: list = []

    def orch_async(name: str) -> None:  # what the step waits for: staging to host memory, then back to training
        path = root / name
        state = shard_state(model, [optimizer], trained_only=False)
        temp = prepare_folder(path) if rank == 0 else None
        dist.barrier()
        box = [str(temp)]
        dist.broadcast_object_list(box, src=0)
        saving = dcp.async_save(state, checkpoint_id=box[0], process_group=save_group, async_stager=stager)
        pending.append(getattr(saving, "upload_completion", saving))

    def orch_load(name: str) -> None:
        load_shards(root / name, model, [optimizer], trained_only=False)
        load_meta(root / name)

    def bare_load(name: str) -> None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=str(root / name))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def settle() -> None:
        dist.barrier()
        if rank == 0:
            os.sync()
        dist.barrier()

    def wipe() -> None:
        for f in pending:
            f.result()
        pending.clear()
        dist.barrier()
        if rank == 0:
            for entry in root.iterdir():
                shutil.rmtree(entry, ignore_errors=True)
            os.sync()
        dist.barrier()

    figures: dict[str, list[float]] = {
        k: [] for k in ("orch_save", "bare_save", "orch_load", "bare_load", "async", "sync")
    }
    for round_ in range(args.rounds + 1):  # round 0: the warm-up, not counted
        order = ["orch", "bare"] if round_ % 2 == 0 else ["bare", "orch"]
        got: dict[str, float] = {}
        for arm in order:
            settle()  # neither arm pays for the other's dirty pages
            got[f"{arm}_save"] = timed(partial(orch_save if arm == "orch" else bare_save, f"{arm}-{round_}"))
        for arm in order:
            got[f"{arm}_load"] = timed(partial(orch_load if arm == "orch" else bare_load, f"{arm}-{round_}"))
        wipe()
        for arm in ["async", "sync"] if round_ % 2 == 0 else ["sync", "async"]:
            settle()
            got[arm] = timed(partial(orch_async if arm == "async" else orch_save, f"{arm}-{round_}"))
            wipe()
        if round_:
            for key, value in got.items():
                figures[key].append(value)
    if rank == 0:
        size = sum(p.numel() * p.element_size() for p in model.parameters())  # DTensor: the global size
        Path(out).write_text(json.dumps({"figures": figures, "param_bytes": size}))
    stager.close()
    dist.destroy_process_group()


# -- --throughput -------------------------------------------------------------------------------


def plain_worker(rank: int, args, model_dir: str, rows_path: str, out: str) -> None:
    """The plain FSDP2 script: the same model, sharded by the same units, AdamW, the same rows in
    micro-batches padded to their longest, one optimizer step per micro-batch."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.builtin.fsdp import shard_units

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK=str(rank), WORLD_SIZE=str(args.ranks))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (args.ranks,))
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows = [json.loads(line) for line in Path(rows_path).read_text().splitlines()]
    mine = rows[rank :: args.ranks]
    batches = []  # tokenized before the clock starts, as the runner's data module does in its map
    for step in range(args.steps):
        batch = mine[(step * args.batch) % len(mine) :][: args.batch]
        enc = tok(
            [r["prompt"] + r["response"] for r in batch],
            padding=True,
            truncation=True,
            max_length=96,
            return_tensors="pt",
        )
        batches.append((enc, enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)))
    start = None
    for step, (enc, labels) in enumerate(batches):
        loss = model(**enc, labels=labels, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 0:
            start = time.perf_counter()  # from the end of the first step, as the runner's figure
    took = time.perf_counter() - (start or 0)
    if rank == 0:
        Path(out).write_text(json.dumps({"samples_per_s": (args.steps - 1) * args.batch * args.ranks / took}))
    dist.destroy_process_group()


def throughput(args) -> None:
    import subprocess

    import tomli_w
    import torch.multiprocessing as mp

    from orchestrator.spec.jobspec import JobSpec
    from training.toy import write_jsonl
    from training.toys.lm_and_ner import build_tiny_llama, instruction_rows

    with tempfile.TemporaryDirectory(prefix="orch-fsdp-rate-") as tmp:
        root = Path(tmp)
        rows = instruction_rows(args.steps * args.batch * args.ranks, seed=3)
        data = write_jsonl(root / "rows.jsonl", rows)
        model = build_tiny_llama(
            root / "llama",
            [r["prompt"] + r["response"] for r in rows],
            hidden=args.hidden,
            layers=args.layers,
            heads=8,
            vocab_size=2000,
        )
        orch, plain = [], []
        for round_ in range(args.rounds + 1):
            for arm in ("orch", "plain") if round_ % 2 == 0 else ("plain", "orch"):
                if arm == "plain":
                    out = root / f"plain-{round_}.json"
                    mp.spawn(plain_worker, args=(args, str(model), str(data), str(out)), nprocs=args.ranks, join=True)
                    rate = json.loads(out.read_text())["samples_per_s"]
                    (plain if round_ else []).append(rate)
                    continue
                run = root / f"orch-{round_}"
                run.mkdir()
                spec = JobSpec.model_validate(
                    {
                        "name": "rate",
                        "gpus": args.ranks,
                        "model": {"name_or_path": str(model), "task": "causal-lm"},
                        "data": {
                            "train": str(data),
                            "prompt_field": "prompt",
                            "response_field": "response",
                            "max_length": 96,
                            "packing": False,
                            "num_workers": 0,
                        },
                        "train": {
                            "max_steps": args.steps,
                            "batch_size": args.batch,
                            "precision": "32",
                            "strategy": "fsdp",
                            "gradient_clip_val": 0,
                            "warmup_ratio": 0,
                            "learning_rate": 1e-4,
                        },
                        "checkpoint": {"every_n_steps": 1_000_000},
                    }
                )
                (run / "job.toml").write_bytes(tomli_w.dumps(spec.to_toml_dict()).encode())
                env = {
                    **os.environ,
                    "ORCH_GPUS_ON_CPU": "1",
                    "CUDA_VISIBLE_DEVICES": "",
                    "OMP_NUM_THREADS": "1",
                    "ORCH_RUN_DIR": str(run),
                    "ORCH_CKPT_DIR": str(run / "checkpoints"),
                    "ORCH_JOB_ID": "1",
                    "ORCH_ATTEMPT": "1",
                    "HF_HUB_OFFLINE": "1",
                    "HF_DATASETS_OFFLINE": "1",
                    "HF_DATASETS_CACHE": str(root / "hf"),
                    "PYTHONPATH": str(REPO),
                }
                done = subprocess.run(
                    [sys.executable, "-m", "training.run", str(run)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
                if done.returncode != 0:
                    raise SystemExit(done.stderr[-3000:])
                progress = json.loads((run / "progress.json").read_text())
                took = float(progress["updated_at"]) - float(progress["first_step_at"])
                rate = (int(progress["step"]) - 1) * args.batch * args.ranks / took
                (orch if round_ else []).append(rate)
        pairs = [a / b for a, b in zip(orch, plain)]
        print(
            f"{args.ranks} CPU ranks, tiny Llama hidden {args.hidden} x {args.layers}, batch {args.batch}, "
            f"{args.steps} steps, {args.rounds} rounds after a warm-up"
        )
        print(
            f"throughput, orch ÷ plain FSDP2: {statistics.median(pairs):.3f} (goal ≥ 0.97); per round "
            f"{', '.join(f'{p:.2f}' for p in pairs)}; samples/s {statistics.median(orch):.1f} ÷ {statistics.median(plain):.1f}"
        )


def ratio(figures: dict[str, list[float]], a: str, b: str) -> tuple[float, list[float]]:
    pairs = [x / y for x, y in zip(figures[a], figures[b])]
    return statistics.median(pairs), pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6, help="even: each arm goes first as often")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--throughput", action="store_true", help="the runner ÷ a plain FSDP2 script instead")
    parser.add_argument("--steps", type=int, default=60, help="--throughput: optimizer steps per run")
    parser.add_argument("--batch", type=int, default=8, help="--throughput: the micro-batch per rank")
    args = parser.parse_args()
    if args.throughput:
        throughput(args)
        return
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="orch-fsdp-bench-") as tmp:
        folder, out = Path(tmp) / "ckpts", Path(tmp) / "out.json"
        folder.mkdir()
        mp.spawn(worker, args=(args, str(folder), str(out)), nprocs=args.ranks, join=True)
        result = json.loads(out.read_text())
    figures = result["figures"]
    print(
        f"{args.ranks} ranks on {args.device}, Llama hidden {args.hidden} x {args.layers} layers, "
        f"{result['param_bytes'] / 1e6:.0f} MB of parameters (+ AdamW state), {args.rounds} rounds after a warm-up"
    )
    for name, (a, b, goal) in {
        "notice save, orch ÷ bare dcp.save": ("orch_save", "bare_save", "≤ 1.2"),
        "resume, orch ÷ bare dcp.load": ("orch_load", "bare_load", "≤ 1.2"),
        "periodic save stall, background ÷ synchronous": ("async", "sync", "≤ 0.25"),
    }.items():
        med, pairs = ratio(figures, a, b)
        print(
            f"{name}: {med:.3f} (goal {goal}); per round {', '.join(f'{p:.2f}' for p in pairs)}; "
            f"medians {statistics.median(figures[a]):.3f} s ÷ {statistics.median(figures[b]):.3f} s "
            f"= {statistics.median(figures[a]) / statistics.median(figures[b]):.3f}"
        )


if __name__ == "__main__":
    main()
