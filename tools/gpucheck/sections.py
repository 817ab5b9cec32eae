"""The sections of the GPU check, in report order: (key, letter, title, function, the least time
in seconds worth starting it with). A function gets (Ctx, Section), records checks and figures,
and may raise frame.Skip(reason)."""

from __future__ import annotations

from .daemon_idle import daemon_idle
from .fsdp import fsdp
from .notice import notice
from .oom import oom
from .resume import resume
from .training_runs import precision_runs, throughput


SECTIONS = [
    ("precision", "a", "built-in runner in 16-mixed and bf16-mixed", precision_runs, 40),
    ("throughput", "b", "runner vs plain Lightning throughput", throughput, 40),
    ("oom", "c", "out of GPU memory: exit 76, half the batch, finish", oom, 40),
    ("resume", "d", "exact resume after SIGTERM (deterministic, and not)", resume, 40),
    ("notice", "e", "notice checkpoint of BERT-large + AdamW on the GPU vs bare torch.save", notice, 40),
    ("daemon_idle", "f", "GPU idle between two queued jobs under a real daemon", daemon_idle, 30),
    ("fsdp", "g", "FSDP: bf16 shards on NCCL, background saves, notice and resume", fsdp, 60),
]
