"""What a preemption costs with the built-in runner, for a BERT-base-sized model (BertConfig()
defaults: 12 layers, hidden 768, vocab 30522; random init, made locally: no download;
BertForSequenceClassification) with AdamW state, measured so that a noisy, shared disk and CPU
cancel out of the headline figure:

- save, per pair: orch's notice checkpoint (a real `python -m training.run` attempt that gets
  SIGTERM; Lightning's save_checkpoint through training/resume/checkpoints.py's AtomicCheckpointIO) and
  a bare `torch.save` of the same model and AdamW state dicts + fsync in this process (the floor no
  checkpointing scheme can beat), one right after the other, the order alternating from pair to
  pair, `sync` before each arm. Both arms are timed in their own process from the end of the step
  (the optimizer and LR-scheduler steps done) to the file fsynced; orch's also includes the rename
  and the folder fsync that make it atomic (the job prints its timings in its "saved" line). The
  headline is the median of the per-pair ratios orch / bare, with their spread. Goal: <= 1.5.
- warm-up before anything is measured: two 1.3 GB writes + fsync, one bare save, and one whole
  job attempt (imports, the tokenized-data cache, the model file in the page cache).
- while the bare arm runs before orch's in a pair, the job is stopped (SIGSTOP) mid-step, so the
  two never compete for the CPU; it continues (SIGCONT) and gets SIGTERM afterwards.
- resumed start-up, per round: a cold attempt (new run folder) and then an attempt resumed from
  its notice checkpoint; time to first step (launch -> end of the first step) of each, resumed -
  cold, against reading and loading that checkpoint alone in this process (torch.load + the
  model's and the optimizer's load_state_dict); split at the start of training (after the
  restore), so the start-up difference and the first batch's own difference show separately.
- also: the step in flight (SIGTERM -> end of that step: the training step's cost, not the
  checkpoint's), SIGTERM -> exit 75, checkpoint size, steps lost (goal 0).

    python -m benchmarks.preemption [--rounds 3] [--seq 16] [--batch 2] [--dir DIR] [--keep] [--json]

Each round gives two save pairs (one per attempt): --rounds 3 = 6 pairs, 7 job attempts with the
warm-up, about 5 minutes on 2 CPU cores. About 1.3 GB per checkpoint (three exist at most at a
time); every file is deleted at the end unless --keep. Exit 1 when the median per-pair ratio is
over the goal or a step was lost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

from .common import REPO
from .preemption_bare import Bare, sync, warm_up_disk
from .preemption_report import GOAL_RATIO, render, summarise

SAVED_RE = re.compile(
    r"SIGTERM: saved (?P<path>\S+) at step (?P<step>\d+) in (?P<took>[\d.]+) s"
    r"(?: \((?P<mb>\d+) MB; write (?P<write>[\d.]+) s, fsync (?P<fsync>[\d.]+) s, "
    r"rename (?P<rename>[\d.]+) s\))?"
)


def build_model(folder: Path) -> Path:
    """A WordPiece tokenizer trained on the toy rows, and a BERT-base-sized random classifier."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from training.toy import build_tiny_bert, sentiment_rows

    build_tiny_bert(
        folder,
        [r["text"] for r in sentiment_rows(2000, seed=1)],
        hidden=32,
        layers=1,
        heads=1,
        vocab_size=400,
        max_positions=512,
    )  # the tokenizer; the tiny model is replaced below
    config = BertConfig(num_labels=2)  # BERT-base: 12 x 768, vocab 30522 (our token ids all fit)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(str(folder))
    return folder


def write_job(run_dir: Path, model: Path, train: Path, batch: int, seq: int) -> None:
    import tomli_w

    spec = {
        "name": "bench",
        "gpus": 0,
        "model": {"name_or_path": str(model), "num_labels": 2},
        "data": {"train": str(train), "max_length": seq, "num_workers": 0},
        "train": {"max_steps": 100_000, "batch_size": batch, "precision": "32", "learning_rate": 2e-5, "seed": 1},
        "checkpoint": {"every_minutes": 10_000, "keep": 1},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.toml").write_bytes(tomli_w.dumps(spec).encode())


# -- orch's arm: real job processes ----------------------------------------------------------------


class Attempt:
    """`python -m training.run RUN_DIR` with every output line timestamped on arrival."""

    def __init__(self, run_dir: Path, n: int, env: dict[str, str], resume: Optional[Path]):
        self.run_dir = run_dir
        env = dict(
            env,
            ORCH_ATTEMPT=str(n),
            ORCH_RESUME_FROM=str(resume or ""),
            ORCH_RUN_DIR=str(run_dir),
            ORCH_CKPT_DIR=str(run_dir / "checkpoints"),
        )
        self.lines: list[tuple[float, str]] = []
        self.log = open(run_dir / f"attempt-{n}.log", "w")
        self.launched = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "training.run", str(run_dir)],
            cwd=str(REPO),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            bufsize=1,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
            self.log.write(line)
        self.log.flush()

    def progress(self) -> dict[str, Any]:
        try:
            return json.loads((self.run_dir / "progress.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_step(self, step: int, timeout: float = 900) -> dict[str, Any]:
        """Poll progress.json until it shows `step` (or later); returns the first such record."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.progress()
            if (p.get("step") or 0) >= step and (p.get("updated_at") or 0) >= self.launched:
                return p
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job exited {self.proc.returncode} before step {step}:\n{self.tail()}")
            time.sleep(0.01)
        raise RuntimeError(f"no step {step} within {timeout}s:\n{self.tail()}")

    def line(self, needle: str) -> Optional[tuple[float, str]]:
        return next(((t, line) for t, line in self.lines if needle in line), None)

    def tail(self) -> str:
        return "\n".join(line for _, line in self.lines[-15:])

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(10)
        self.log.close()
        return code


def first_step(att: Attempt, from_step: int) -> dict[str, float]:
    """Launch -> the end of the attempt's first training step (the job's first_step_at), split at
    the start of training (train_started_at: after the checkpoint restore, before the first batch)."""
    p = att.wait_step(from_step + 1)
    if p["step"] != from_step + 1 or not p.get("first_step_at") or not p.get("train_started_at"):
        raise RuntimeError(f"missed the first step: progress jumped to {p['step']}")
    return {
        "first_step_s": float(p["first_step_at"]) - att.launched,
        "start_up_s": float(p["train_started_at"]) - att.launched,
        "first_batch_s": float(p["first_step_at"]) - float(p["train_started_at"]),
    }


def interrupt(att: Attempt) -> dict[str, Any]:
    """SIGTERM the attempt's group now and read what its notice save took."""
    sent = time.time()
    att.signal(signal.SIGTERM)
    code = att.finish()
    exited = time.time()
    if code != 75:
        raise RuntimeError(f"expected exit 75 after SIGTERM, got {code}:\n{att.tail()}")
    found = att.line("SIGTERM: saved")
    match = SAVED_RE.search(found[1]) if found else None
    if not found or not match or match["write"] is None:
        raise RuntimeError(f"no timed 'saved' line:\n{att.tail()}")
    arrived, took = found[0], float(match["took"])
    path = Path(match["path"])
    last = att.progress()  # written right after the save
    return {
        "checkpoint": path.name,
        "checkpoint_step": int(match["step"]),
        "bytes": path.stat().st_size,
        "steps_lost": int(last["step"]) - int(match["step"]),
        "save_s": took,
        "write_s": float(match["write"]),
        "fsync_s": float(match["fsync"]),
        "rename_s": float(match["rename"]),
        "step_in_flight_s": (arrived - took) - sent,  # SIGTERM -> end of the step in flight (approx.)
        "sigterm_to_exit_s": exited - sent,
        "after_save_s": exited - arrived,  # the "saved" line -> the process gone (retention, teardown)
        "path": path,
    }


class Bench:
    def __init__(self, work: Path, batch: int, seq: int):
        self.work, self.batch, self.seq = work, batch, seq
        self.model = build_model(work / "bert-base")
        from training.toy import sentiment_rows, write_jsonl

        self.train = write_jsonl(work / "train.jsonl", sentiment_rows(400, seed=3))
        self.env = dict(os.environ)
        self.env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_CACHE": str(work / "hf-cache"),
                "TOKENIZERS_PARALLELISM": "false",
                "ORCH_JOB_ID": "1",
                "ORCH_PROGRESS_EVERY_S": "0.000001",
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
            }
        )
        self.bare = Bare(batch, seq)
        self.n = 0

    def run_dir(self, name: str) -> Path:
        run_dir = self.work / name
        write_job(run_dir, self.model, self.train, self.batch, self.seq)
        return run_dir

    def attempt(self, run_dir: Path, resume: Optional[Path], bare_first: bool) -> dict[str, Any]:
        """One job attempt: its time to first step, then one save pair (orch's notice save on
        SIGTERM and a bare save, in the order asked)."""
        self.n += 1
        sync()
        att = Attempt(run_dir, self.n, self.env, resume)
        from_step = 0
        if resume is not None:
            from_step = int(resume.stem.rsplit("-", 1)[1])
        first = first_step(att, from_step)
        att.wait_step(from_step + 2)
        bare = None
        if bare_first:
            att.signal(signal.SIGSTOP)  # mid-step: no CPU taken from the bare arm
            try:
                bare = self.bare.save(self.work, self.n)
            finally:
                att.signal(signal.SIGCONT)
        sync()
        orch = interrupt(att)
        if not bare_first:
            bare = self.bare.save(self.work, self.n)
        assert bare is not None
        return {
            "attempt": self.n,
            "resumed_from": resume.name if resume else None,
            **first,
            "order": "bare, orch" if bare_first else "orch, bare",
            "orch": orch,
            "bare": bare,
            "ratio": orch["save_s"] / bare["save_s"],
        }

    def run(self, rounds: int, log=lambda msg: None) -> dict[str, Any]:
        warm = {"disk_write_s": warm_up_disk(self.work)}
        warm["bare_save_s"] = self.bare.save(self.work, 0)["save_s"]
        att = self.attempt(self.run_dir("warm-up"), None, bare_first=False)
        warm["attempt"] = _clean(att)
        shutil.rmtree(self.work / "warm-up" / "checkpoints", ignore_errors=True)
        log(
            f"warm-up: disk {', '.join(f'{x:.2f}' for x in warm['disk_write_s'])} s, bare {warm['bare_save_s']:.2f} s, "
            f"orch {att['orch']['save_s']:.2f} s, first step {att['first_step_s']:.1f} s"
        )
        pairs, starts = [], []
        for r in range(rounds):
            run_dir = self.run_dir(f"round-{r}")
            cold = self.attempt(run_dir, None, bare_first=r % 2 == 1)
            loaded = self.bare.load(cold["orch"]["path"])
            resumed = self.attempt(run_dir, cold["orch"]["path"], bare_first=r % 2 == 0)
            for a in (cold, resumed):
                log(
                    f"round {r} attempt {a['attempt']} ({'resumed' if a['resumed_from'] else 'cold'}): first step "
                    f"{a['first_step_s']:.1f} s; {a['order']}: orch {a['orch']['save_s']:.2f} s, bare "
                    f"{a['bare']['save_s']:.2f} s, ratio {a['ratio']:.2f}"
                )
            pairs += [_clean(cold), _clean(resumed)]
            starts.append(
                {
                    "cold_first_step_s": cold["first_step_s"],
                    "resumed_first_step_s": resumed["first_step_s"],
                    "resumed_minus_cold_s": resumed["first_step_s"] - cold["first_step_s"],
                    "start_up_resumed_minus_cold_s": resumed["start_up_s"] - cold["start_up_s"],
                    "first_batch_resumed_minus_cold_s": resumed["first_batch_s"] - cold["first_batch_s"],
                    **loaded,
                }
            )
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        return {"warm_up": warm, "pairs": pairs, "starts": starts}


def _clean(att: dict[str, Any]) -> dict[str, Any]:
    att = dict(att, orch=dict(att["orch"]))
    att["orch"]["path"] = str(att["orch"]["path"])
    return att


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (cold attempt, resumed attempt); each gives two save pairs (default 3)",
    )
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (progress goes to stderr)")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (5 pairs or more)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    work = Path(tempfile.mkdtemp(prefix="orch-preempt-bench-", dir=args.dir))
    try:
        bench = Bench(work, args.batch, args.seq)
        raw = bench.run(args.rounds, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report = summarise(raw, args.batch, args.seq)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render(report)
    return 0 if report["ratio"]["median"] <= GOAL_RATIO and not any(report["steps_lost"]) else 1


if __name__ == "__main__":
    sys.exit(main())
