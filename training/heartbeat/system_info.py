"""What torch itself says about the machine (CUDA, cuDNN, NCCL, the devices it sees), which orch
cannot know from outside the job: one line in the attempt's log, and added to the first attempt's
provenance/system.json (orch wrote the rest of it before the job started)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.contract import ENV_ATTEMPT, SYSTEM_JSON, provenance_dir, read_json, write_json_atomic


def torch_runtime() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    nccl = None
    if cuda:
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # a build without NCCL
            nccl = None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": nccl,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
    }


def describe(rt: dict[str, Any]) -> str:
    parts = [f"torch {rt['torch']}"]
    parts += [f"{k} {rt[k]}" for k in ("cuda", "cudnn", "nccl") if rt.get(k)]
    parts.append("devices: " + (", ".join(rt["devices"]) if rt["devices"] else "CPU only"))
    return ", ".join(parts)


def record_runtime(run_dir: Path) -> str:
    """The runtime facts; written into system.json when orch recorded it for this very attempt."""
    rt = torch_runtime()
    path = provenance_dir(run_dir) / SYSTEM_JSON
    info = read_json(path)
    if info is not None and str(info.get("attempt")) == os.environ.get(ENV_ATTEMPT) and "runtime" not in info:
        try:
            write_json_atomic(path, dict(info, runtime=rt))
        except OSError:  # provenance never stops training
            pass
    return describe(rt)
