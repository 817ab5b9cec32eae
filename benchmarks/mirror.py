"""The mirror's cost: a BERT-base + AdamW checkpoint (~1.3 GB) pushed to an S3-compatible server
on loopback (moto's server, in this process's threads) through orch's uploader vs a bare obstore
put of the same file to the same server at the same concurrency, arms alternated after a warm-up.

- upload ratio: bare put time / orch time (goal >= 0.9). orch's path is the daemon's: sha256 of
  the file, the put under its content-named key, the uploads-queue bookkeeping in SQLite, and the
  manifest naming it (the commit point).
  The split of orch's time (`split_s`, medians over the orch reps): the put (with the sha256
  taken from the bytes as they go out), a separate hash pass if the uploader makes one, the
  manifest's conditional write, retention's deletes, SQLite, and the rest (Python between them).
  `--size-mb N` uses N MB of random bytes instead of the BERT checkpoint (quicker to iterate on;
  the upload path does not look inside the file).
- notice -> mirrored: the same path at notice_concurrency, against AWS's 105 s window.
- adopt: `orch adopt` on a fresh home (download + sha256 verify + import), the part of "adopt ->
  first resumed step" that grows with the checkpoint (the job's own start-up is the same as any
  resume: see benchmarks/preemption.py).

Those two on the training step (mirror_step.py):

- periodic checkpoint blocking time (`--blocking`): how long the training step is held by a
  periodic save written in the background (training/resume/snapshot.py: the snapshot) vs today's
  synchronous save (serialise + fsync + rename), same state, arms alternated (goal <= 0.25).

    python -m benchmarks.mirror [--reps 2] [--concurrency 4] [--part-mb 16] [--ckpt PATH | --size-mb N]
    python -m benchmarks.mirror --blocking [--reps 3] [--ckpt PATH]
    python -m benchmarks.mirror --throughput [--reps 2] [--steps 200]

- throughput (`--throughput`): a small BERT (hidden 256, 4 layers) trained by the built-in runner
  under a real daemon, checkpointing every 20 steps, with [storage] file:// (the uploader hashes and
  copies every checkpoint while the job trains) vs without; steps/s from the first step to the
  last, arms alternated (goal >= 0.97).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.contract import notice_name, periodic_name

from .mirror_step import blocking, throughput


def make_checkpoint(path: Path) -> None:
    """A Lightning-shaped checkpoint of BERT-base (random init) with AdamW state after one step."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    out = model(input_ids=torch.randint(0, 1000, (2, 16)), labels=torch.tensor([0, 1]))
    out.loss.backward()
    opt.step()
    torch.save(
        {
            "state_dict": model.state_dict(),
            "optimizer_states": [opt.state_dict()],
            "global_step": 1,
            "epoch": 0,
            "loops": {},
        },
        path,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocking", action="store_true")
    ap.add_argument("--throughput", action="store_true")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--part-mb", type=int, default=16)
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument(
        "--size-mb", type=int, default=None, help="random bytes of this size instead of the BERT checkpoint"
    )
    args = ap.parse_args()
    if args.throughput:
        throughput(args.reps, args.steps)
        return
    import obstore

    from orchestrator.spec.config import Config, StorageSection
    from orchestrator.daemon.mirror import Mirror

    from .s3_bench import BUCKET_URL, home_with_a_job, start_s3

    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-mirror-"))
    ckpt = args.ckpt or tmp / "step-00000001.ckpt"
    if not ckpt.exists() and args.size_mb:
        with open(ckpt, "wb") as f:
            for _ in range(args.size_mb):
                f.write(os.urandom(1_000_000))
    if not ckpt.exists():
        t = time.monotonic()
        make_checkpoint(ckpt)
        print(f"made {ckpt.name}: {ckpt.stat().st_size / 1e9:.2f} GB in {time.monotonic() - t:.0f} s", flush=True)
    size = ckpt.stat().st_size
    if args.blocking:
        blocking(ckpt, args.reps)
        return

    server, endpoint = start_s3()
    storage = StorageSection(
        url=BUCKET_URL,
        endpoint=endpoint,
        part_size_mb=args.part_mb,
        concurrency=args.concurrency,
        notice_concurrency=args.concurrency,
    )
    config = Config(storage=storage)
    home, store, job, run_ckpts = home_with_a_job(tmp / "home", "bench")
    mirror = Mirror(home, config, store)
    bare = mirror.remote.uploads  # the client the mirror uploads with
    split = _instrument(mirror)
    splits: list[dict[str, float]] = []
    import hashlib

    t = time.monotonic()
    with open(ckpt, "rb") as f:
        h = hashlib.sha256()
        while block := f.read(16 * 1024 * 1024):
            h.update(block)
    hash_alone_s = time.monotonic() - t

    def bare_put(i: int) -> float:
        t = time.monotonic()
        obstore.put(
            bare, f"bare/{i}.ckpt", ckpt, chunk_size=args.part_mb * 1024 * 1024, max_concurrency=args.concurrency
        )
        took = time.monotonic() - t
        obstore.delete(bare, f"bare/{i}.ckpt")
        return took

    def orch_put(i: int, notice: bool = False) -> float:
        name = notice_name(i) if notice else periodic_name(i)
        target = run_ckpts / name
        if not target.exists():
            os.link(ckpt, target)
        split.clear()
        t = time.monotonic()
        mirror.scan(store.get(job.id), time.time())  # queue it, as the daemon's pass does
        mirror.upload_pending()
        mirror.sync_job(store.get(job.id), time.time())  # the manifest naming it: now it is mirrored
        took = time.monotonic() - t
        splits.append({**split, "other": took - sum(split.values())})
        row = store.mirror_state(job.id)
        assert row["checkpoints"][0]["name"] == name, row["checkpoints"]
        target.unlink()
        return took

    # warm-up: one of each (page cache, connections, moto's first multipart)
    bare_put(0)
    orch_put(1)
    bares, orchs = [], []
    for rep in range(args.reps):
        for arm in ("bare", "orch") if rep % 2 == 0 else ("orch", "bare"):
            if arm == "bare":
                bares.append(bare_put(rep + 10))
            else:
                orchs.append(orch_put(rep + 10))
            print(f"rep {rep} {arm}: {(bares if arm == 'bare' else orchs)[-1]:.2f} s", flush=True)
    orch_splits = splits[1:]  # not the warm-up
    notice_s = orch_put(99, notice=True)
    print(f"notice checkpoint mirrored in {notice_s:.2f} s", flush=True)

    # adopt on a fresh home: download + verify + import (`orch adopt` as a user runs it)
    fresh = tmp / "fresh"
    cfg = tmp / "config.toml"
    cfg.write_text(f'[storage]\nurl = "s3://orch-bench/m"\nendpoint = "{endpoint}"\npart_size_mb = {args.part_mb}\n')
    # the uploader's manifest names the notice checkpoint; release the lease so adopt needs no wait
    mirror.release_all()
    t = time.monotonic()
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "--home",
            str(fresh),
            "--config",
            str(cfg),
            "adopt",
            "s3://orch-bench/m",
            "--all",
            "--yes",
        ],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    adopt_s = time.monotonic() - t
    print(ran.stdout.strip(), ran.stderr.strip(), flush=True)

    ratio = statistics.median(bares) / statistics.median(orchs)
    report = {
        "checkpoint_gb": round(size / 1e9, 3),
        "bare_put_s": [round(x, 2) for x in bares],
        "orch_mirrored_s": [round(x, 2) for x in orchs],
        "upload_ratio_bare_over_orch": round(ratio, 3),
        "pair_ratios": [round(b / o, 3) for b, o in zip(bares, orchs)],
        "split_s": {
            k: round(statistics.median(sp.get(k, 0.0) for sp in orch_splits), 3)
            for k in ("put", "hash", "manifest", "retention", "sqlite", "other")
        },
        "sha256_alone_s": round(hash_alone_s, 2),
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "orch_mb_per_s": round(size / 1e6 / statistics.median(orchs), 1),
        "notice_to_mirrored_s": round(notice_s, 2),
        "notice_deadline_s": 105,
        "adopt_fresh_home_s": round(adopt_s, 2),
        "adopt_rc": ran.returncode,
        "concurrency": args.concurrency,
        "part_mb": args.part_mb,
    }
    print(json.dumps(report, indent=1))
    server.stop()


def _instrument(mirror: Any) -> dict[str, float]:
    """Seconds spent in each part of orch's path, added up per call into the returned dict: the
    put, a hash pass, the manifest's write, retention's deletes, and every SQLite call of the store."""
    import functools
    import inspect

    spent: dict[str, float] = {}
    inside: set[str] = set()

    def timed(part: str, fn: Any) -> Any:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*a: Any, **kw: Any) -> Any:
                t = time.monotonic()
                try:
                    return await fn(*a, **kw)
                finally:
                    spent[part] = spent.get(part, 0.0) + time.monotonic() - t

            return awrapper

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            if part in inside:  # a store method calling another: counted once
                return fn(*a, **kw)
            inside.add(part)
            t = time.monotonic()
            try:
                return fn(*a, **kw)
            finally:
                inside.discard(part)
                spent[part] = spent.get(part, 0.0) + time.monotonic() - t

        return wrapper

    remote = mirror.remote
    for name, part in (
        ("put_file_async", "put"),
        ("put_file_hashed_async", "put"),
        ("cas_put", "manifest"),
        ("get_with_etag", "manifest"),
        ("delete", "retention"),
    ):
        if hasattr(remote, name):
            setattr(remote, name, timed(part, getattr(remote, name)))
    store = mirror.store
    for name in dir(type(store)):
        if not name.startswith("_") and callable(getattr(store, name)) and name not in ("db",):
            setattr(store, name, timed("sqlite", getattr(store, name)))
    import importlib

    for mod in ("orchestrator.daemon.mirror.uploads", "orchestrator.daemon.mirror.uploader"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(m, "sha256_file"):  # an uploader that hashes before the put
            m.sha256_file = timed("hash", m.sha256_file)
    return spent


if __name__ == "__main__":
    main()
