"""GPU discovery and slot allocation. Discovery asks `nvidia-smi` (never torch: the daemon stays
light); config `[daemon] gpus` overrides it. Each job gets its own CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int


def discover(nvidia_smi: Optional[str] = None, timeout_s: float = 10.0) -> list[GpuInfo]:
    """The machine's GPUs, or [] when there is no nvidia-smi or it fails (a CPU box)."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            mem = int(parts[2]) if parts[2].isdigit() else 0
            gpus.append(GpuInfo(int(parts[0]), parts[1], mem))
    return gpus


def managed_gpus(setting: Union[str, Sequence[int]], discovered: Optional[Iterable[GpuInfo]] = None) -> list[int]:
    """The GPU indices the daemon hands out: config's list, or discovery for "auto"."""
    if setting == "auto":
        return [g.index for g in (discover() if discovered is None else discovered)]
    return sorted(set(int(i) for i in setting))


def visible_devices(gpu_ids: Sequence[int]) -> str:
    # An empty value hides every GPU from a gpus=0 job, so it cannot grab one by accident.
    return ",".join(str(i) for i in gpu_ids)


def absent_gpus(setting: Union[str, Sequence[int]], discovered: Iterable[GpuInfo]) -> list[int]:
    """The GPUs `[daemon] gpus` lists that this machine does not have (none for "auto")."""
    if setting == "auto":
        return []
    have = {g.index for g in discovered}
    return [i for i in sorted(set(int(i) for i in setting)) if i not in have]


def absent_gpus_problem(setting: Union[str, Sequence[int]], discovered: Sequence[GpuInfo]) -> Optional[str]:
    """One line when `[daemon] gpus` names GPUs nvidia-smi does not show: orch would hand them to
    jobs, which would find no GPU (a config copied from another machine, a GPU-less image)."""
    missing = absent_gpus(setting, discovered)
    if not missing:
        return None
    found = (
        "nvidia-smi finds no GPU here"
        if not discovered
        else "nvidia-smi finds only GPU " + ", ".join(str(g.index) for g in discovered)
    )
    listed = ", ".join(str(i) for i in missing)
    return (
        f"[daemon] gpus lists GPU {listed}, which this machine does not have ({found}): a job asking for GPUs "
        'would get none; set gpus = "auto", or list only the GPUs nvidia-smi shows'
    )
