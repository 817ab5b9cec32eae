"""What a preemption costs with the built-in runner, for a BERT-base-sized model (BertConfig()
defaults: 12 layers, hidden 768, vocab 30522; random init; BertForSequenceClassification) with
AdamW state:

- save: seconds from the end of the step in flight to a durable (fsynced) notice checkpoint, in a
  real `python -m training.run` subprocess that gets SIGTERM (orch's arm: Lightning's
  save_checkpoint through training/checkpoints.py's AtomicCheckpointIO), against a bare
  `torch.save` of the same model and optimizer state dicts + fsync in this process (the floor no
  checkpointing scheme can beat). Goal: ratio <= 1.5.
- the step in flight: SIGTERM -> the end of the step that was running (reported separately: it is
  the training step's cost, not the checkpoint's).
- checkpoint size, steps lost (goal 0: the notice checkpoint is at the last step finished), and
  time to first step of a resumed attempt (loads the checkpoint) against a cold start.

How the orch arm is timed: the job writes progress.json at the end of every step
(ORCH_PROGRESS_EVERY_S tiny), so the last progress.json before the exit holds the step in flight
and the time it ended (`updated_at`, written in on_train_batch_end just before the save). The
runner prints "[orch] SIGTERM: saved ..." right after save_checkpoint returns (after the fsync of
the file and of its folder); this process timestamps every output line as it arrives. The file's
mtime (the last byte written, before the fsync) is reported too.

    python benchmarks/preemption.py [--repeats 2] [--seq 16] [--batch 2] [--dir DIR] [--keep] [--json]

About 1.3 GB per checkpoint (two exist at most at a time); every file is deleted at the end unless
--keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
GOAL_RATIO = 1.5


def build_model(folder: Path) -> Path:
    """A WordPiece tokenizer trained on the toy rows, and a BERT-base-sized random classifier."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from training.toy import build_tiny_bert, sentiment_rows

    build_tiny_bert(folder, [r["text"] for r in sentiment_rows(2000, seed=1)], hidden=32, layers=1, heads=1,
                    vocab_size=400, max_positions=512)  # the tokenizer; the tiny model is replaced below
    config = BertConfig(num_labels=2)  # BERT-base: 12 x 768, vocab 30522 (our token ids all fit)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(str(folder))
    return folder


def write_job(run_dir: Path, model: Path, train: Path, batch: int, seq: int) -> None:
    import tomli_w

    spec = {
        "name": "bench", "gpus": 0,
        "model": {"name_or_path": str(model), "num_labels": 2},
        "data": {"train": str(train), "max_length": seq, "num_workers": 0},
        "train": {"max_steps": 100_000, "batch_size": batch, "precision": "32", "learning_rate": 2e-5, "seed": 1},
        "checkpoint": {"every_minutes": 10_000, "keep": 1},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.toml").write_bytes(tomli_w.dumps(spec).encode())


# -- the bare arm --------------------------------------------------------------------------------


def bare_saves(folder: Path, repeats: int, batch: int, seq: int) -> dict[str, Any]:
    """One AdamW step on BERT-base, then `repeats` x (state dicts -> torch.save -> fsync), timed from
    the end of the step."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=2))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    ids = torch.randint(5, 400, (batch, seq))
    times, size = [], 0
    for _ in range(repeats):
        loss = model(input_ids=ids, labels=torch.zeros(batch, dtype=torch.long)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        start = time.time()  # the end of the step
        path = folder / "bare.ckpt"
        with open(path, "wb") as fh:
            torch.save({"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()]}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        times.append(time.time() - start)
        size = path.stat().st_size
        path.unlink()
    del model, opt
    return {"save_s": times, "bytes": size}


# -- orch's arm: a real job process ----------------------------------------------------------------


class Attempt:
    """`python -m training.run RUN_DIR` with every output line timestamped on arrival."""

    def __init__(self, run_dir: Path, n: int, env: dict[str, str], resume: Optional[Path]):
        self.run_dir = run_dir
        env = dict(env, ORCH_ATTEMPT=str(n), ORCH_RESUME_FROM=str(resume or ""))
        self.lines: list[tuple[float, str]] = []
        self.log = open(run_dir / f"attempt-{n}.log", "w")
        self.launched = time.time()
        self.proc = subprocess.Popen([sys.executable, "-m", "training.run", str(run_dir)], cwd=str(REPO), env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     text=True, bufsize=1)
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

    def line_at(self, needle: str) -> Optional[float]:
        return next((t for t, line in self.lines if needle in line), None)

    def tail(self) -> str:
        return "\n".join(line for _, line in self.lines[-15:])

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(10)
        self.log.close()
        return code


def interrupt(att: Attempt, at_step: int) -> dict[str, Any]:
    """Let the attempt reach `at_step`, SIGTERM its group, and time what follows."""
    att.wait_step(at_step)
    sent = time.time()
    os.killpg(att.proc.pid, signal.SIGTERM)
    code = att.finish()
    exited = time.time()
    if code != 75:
        raise RuntimeError(f"expected exit 75 after SIGTERM, got {code}:\n{att.tail()}")
    notices = sorted((att.run_dir / "checkpoints").glob("notice-step-*.ckpt"))
    ckpt = notices[-1]
    ckpt_step = int(ckpt.stem.rsplit("-", 1)[1])
    last = att.progress()  # written at the end of the step in flight, just before the save
    saved_line = att.line_at("SIGTERM: saved")
    if saved_line is None:
        raise RuntimeError(f"no 'saved' line:\n{att.tail()}")
    step_end = float(last["updated_at"])
    return {
        "sigterm_at_step": at_step,
        "checkpoint": ckpt.name, "checkpoint_step": ckpt_step, "bytes": ckpt.stat().st_size,
        "steps_lost": int(last["step"]) - ckpt_step,
        "step_in_flight_s": step_end - sent,
        "save_s": saved_line - step_end,  # end of step -> file and folder fsynced
        "save_to_mtime_s": ckpt.stat().st_mtime - step_end,  # end of step -> last byte written
        "sigterm_to_exit_s": exited - sent,
        "path": ckpt,
    }


def first_step_s(att: Attempt, from_step: int) -> float:
    """Launch -> the end of the attempt's first training step (its progress.json timestamp)."""
    p = att.wait_step(from_step + 1)
    if p["step"] != from_step + 1:
        raise RuntimeError(f"missed the first step: progress jumped to {p['step']}")
    return float(p["updated_at"]) - att.launched


def orch_arm(work: Path, model: Path, train: Path, repeats: int, batch: int, seq: int) -> dict[str, Any]:
    run_dir = work / "run"
    write_job(run_dir, model, train, batch, seq)
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_CACHE": str(work / "hf-cache"), "TOKENIZERS_PARALLELISM": "false",
                "ORCH_RUN_DIR": str(run_dir), "ORCH_CKPT_DIR": str(run_dir / "checkpoints"), "ORCH_JOB_ID": "1",
                "ORCH_PROGRESS_EVERY_S": "0.000001", "PYTHONPATH": os.pathsep.join(
                    p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)})
    cold = Attempt(run_dir, 1, env, None)
    cold_first = first_step_s(cold, 0)
    saves = [interrupt(cold, 3)]
    resumed_first = []
    for n in range(2, repeats + 2):
        prev = saves[-1]
        att = Attempt(run_dir, n, env, prev["path"])
        resumed_first.append(first_step_s(att, prev["checkpoint_step"]))
        saves.append(interrupt(att, prev["checkpoint_step"] + 3))
    for s in saves:
        s["path"] = str(s["path"])
    return {"cold_first_step_s": cold_first, "resumed_first_step_s": resumed_first, "saves": saves}


def render(report: dict[str, Any]) -> None:
    bare, orch = report["bare"], report["orch"]
    orch_save = [s["save_s"] for s in orch["saves"]]
    ratio = report["ratio"]
    mb = orch["saves"][0]["bytes"] / 1e6
    print(f"BERT-base + AdamW, batch {report['batch']} x seq {report['seq']}, CPU")
    print(f"  checkpoint: orch {mb:.0f} MB (Lightning: weights, AdamW, loops, RNG), bare {bare['bytes'] / 1e6:.0f} MB")
    print("  end of step -> durable file (s): orch " + ", ".join(f"{x:.2f}" for x in orch_save)
          + " | bare " + ", ".join(f"{x:.2f}" for x in bare["save_s"]))
    print(f"  median ratio orch/bare: {ratio:.2f} (goal <= {GOAL_RATIO})")
    print("  end of step -> last byte written (orch, mtime): "
          + ", ".join(f"{s['save_to_mtime_s']:.2f}" for s in orch["saves"]))
    print("  SIGTERM -> end of the step in flight (s): "
          + ", ".join(f"{s['step_in_flight_s']:.2f}" for s in orch["saves"]))
    print("  SIGTERM -> exit 75 (s): " + ", ".join(f"{s['sigterm_to_exit_s']:.2f}" for s in orch["saves"]))
    print(f"  steps lost: {report['steps_lost']} (goal 0)")
    print(f"  time to first step: cold {orch['cold_first_step_s']:.1f}s, resumed "
          + ", ".join(f"{x:.1f}s" for x in orch["resumed_first_step_s"]))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="resumed attempts (each adds one save sample)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO))
    from training.toy import sentiment_rows, write_jsonl

    work = Path(tempfile.mkdtemp(prefix="orch-preempt-bench-", dir=args.dir))
    try:
        model = build_model(work / "bert-base")
        train = write_jsonl(work / "train.jsonl", sentiment_rows(400, seed=3))
        bare = bare_saves(work, args.repeats + 1, args.batch, args.seq)
        orch = orch_arm(work, model, train, args.repeats, args.batch, args.seq)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    orch_save = [s["save_s"] for s in orch["saves"]]
    ratio = statistics.median(orch_save) / statistics.median(bare["save_s"])
    report = {"model": "BertForSequenceClassification(BertConfig()), AdamW", "batch": args.batch, "seq": args.seq,
              "bare": bare, "orch": orch, "median_orch_save_s": statistics.median(orch_save),
              "median_bare_save_s": statistics.median(bare["save_s"]), "ratio": ratio,
              "steps_lost": [s["steps_lost"] for s in orch["saves"]], "goal_ratio": GOAL_RATIO}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render(report)
    return 0 if ratio <= GOAL_RATIO and not any(report["steps_lost"]) else 1


if __name__ == "__main__":
    sys.exit(main())
