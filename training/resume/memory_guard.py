"""Whether a job may keep a background snapshot of its training state in host memory. A periodic
checkpoint written off the step (training/resume/snapshot.py) holds a copy of the whole state for the
job's lifetime: 1.3 GB for BERT-base with AdamW, over 100 GB for a full 7B fine-tune. Before the
first snapshot its size is weighed against the memory this process may still use (the least of
/proc/meminfo's MemAvailable, the cgroup's limit and RLIMIT_AS), less what other running jobs'
snapshots already hold (the daemon passes ORCH_SNAPSHOTS_HELD_BYTES); above SAFE_SHARE of it the
job saves synchronously instead, with one warning in its log and in `orch show`."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from orchestrator.contract import ENV_RUN_DIR, ENV_SNAPSHOTS_HELD, SNAPSHOT_MEMORY, write_json_atomic

SAFE_SHARE = 0.5  # of the memory left: training itself still grows (activations, the optimizer's first step)


def state_bytes(obj: Any, seen: Optional[set[int]] = None) -> int:
    """Bytes of the tensors in a checkpoint dict (each storage counted once): what a snapshot copies."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        try:
            key = obj.untyped_storage().data_ptr()
        except RuntimeError:
            key = id(obj)
        if key in seen:
            return 0
        seen.add(key)
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v, seen) for v in obj)
    return 0


def _meminfo_available() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> Optional[int]:
    """cgroup v2: memory.max less memory.current of this process's group, when it has a limit."""
    try:
        rel = next(
            line.split("::", 1)[1]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
        folder = Path("/sys/fs/cgroup") / rel.strip().lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((folder / "memory.current").read_text().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def _rlimit_available() -> Optional[int]:
    """RLIMIT_AS less this process's address space now (VmSize)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(0, soft - int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_bytes() -> Optional[int]:
    found = [v for v in (_meminfo_available(), _cgroup_available(), _rlimit_available()) if v is not None]
    return min(found) if found else None


def held_by_others() -> int:
    try:
        return max(0, int(os.environ.get(ENV_SNAPSHOTS_HELD) or 0))
    except ValueError:
        return 0


def decide(size: int, available: Optional[int], held: int) -> dict[str, Any]:
    """{"background": bool, "state_bytes", "available_bytes", "held_by_others_bytes", "reason"}."""
    info = {
        "state_bytes": size,
        "available_bytes": available,
        "held_by_others_bytes": held,
        "background": True,
        "reason": "",
    }
    if available is None:
        return info  # cannot tell: as before
    room = max(0, available - held) * SAFE_SHARE
    if size > room:
        info["background"] = False
        info["reason"] = (
            f"the training state ({size / 1e6:,.0f} MB) is more than {SAFE_SHARE:.0%} of the host "
            f"memory left ({available / 1e6:,.0f} MB available"
            + (f", {held / 1e6:,.0f} MB of it held by other jobs' snapshots" if held else "")
            + "): periodic checkpoints are written synchronously (the step waits for each write)"
        )
    return info


def check(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Weigh the state once, record the decision in the run folder, warn once when it says no."""
    info = decide(state_bytes(checkpoint), available_bytes(), held_by_others())
    run_dir = os.environ.get(ENV_RUN_DIR)
    if run_dir:
        try:
            write_json_atomic(Path(run_dir) / SNAPSHOT_MEMORY, info)
        except OSError:
            pass
    if not info["background"]:
        print(f"[orch] warning: {info['reason']}", file=sys.stderr, flush=True)
    return info
