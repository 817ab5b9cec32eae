"""benchmarks/preemption.py's floor: BERT-base + AdamW saved with a bare torch.save + fsync in this
process (no checkpointing scheme can beat it) and loaded back, and the disk warm-up before anything
is measured. orch's arm, the real job processes, is in preemption.py."""

from __future__ import annotations

import os
import time
from pathlib import Path


def sync() -> None:
    """Flush every dirty page on the machine, so an arm does not pay for the writes before it."""
    os.sync()


def warm_up_disk(folder: Path, size: int = 1_300_000_000, times: int = 2) -> list[float]:
    """Checkpoint-sized writes + fsync before anything is measured (a cold disk's first big write
    can take several times as long as the next)."""
    block = b"\x5a" * (16 << 20)
    took = []
    for i in range(times):
        path = folder / f"warm-up-{i}.bin"
        sync()
        start = time.perf_counter()
        with open(path, "wb") as fh:
            for _ in range(size // len(block)):
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
        took.append(time.perf_counter() - start)
        path.unlink()
    return took


# -- the bare arm --------------------------------------------------------------------------------


class Bare:
    """BERT-base + AdamW in this process, grouped like the runner's (decay / no decay), so its
    state dicts have the same tensors as the job's and the job's checkpoint loads into it."""

    def __init__(self, batch: int, seq: int):
        import torch
        from transformers import BertConfig, BertForSequenceClassification

        self.torch = torch
        torch.manual_seed(0)
        self.model = BertForSequenceClassification(BertConfig(num_labels=2))
        self.model.train()
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            (no_decay if param.ndim < 2 or "LayerNorm" in name else decay).append(param)
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=2e-5
        )
        self.ids = torch.randint(5, 400, (batch, seq))
        self.labels = torch.zeros(batch, dtype=torch.long)

    def save(self, folder: Path, n: int) -> dict[str, float]:
        """One training step, then state dicts -> torch.save -> fsync of a new file, timed from the
        end of the step."""
        torch = self.torch
        loss = self.model(input_ids=self.ids, labels=self.labels).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        path = folder / f"bare-{n}.ckpt"
        sync()
        start = time.perf_counter()  # the end of the step
        with open(path, "wb") as fh:
            torch.save({"state_dict": self.model.state_dict(), "optimizer_states": [self.opt.state_dict()]}, fh)
            fh.flush()
            written = time.perf_counter()
            os.fsync(fh.fileno())
        end = time.perf_counter()
        size = path.stat().st_size
        path.unlink()
        return {"save_s": end - start, "write_s": written - start, "fsync_s": end - written, "bytes": size}

    def load(self, path: Path) -> dict[str, float]:
        """Read and load a checkpoint of the job into this model and optimizer, as Lightning's
        restore does (a full torch.load, then load_state_dict)."""
        torch = self.torch
        sync()
        start = time.perf_counter()
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        read = time.perf_counter()
        self.model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()})
        self.opt.load_state_dict(ckpt["optimizer_states"][0])
        end = time.perf_counter()
        del ckpt
        return {"load_s": end - start, "read_s": read - start, "load_state_dict_s": end - read}
