"""The sbatch script of one attempt (attempt-<n>.sbatch in the run folder) and the check that the
run folder is on a filesystem the Slurm nodes share. Pure: no Slurm command runs here."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...spec.bounds import control_problem
from ...contract import attempt_log, attempt_sbatch
from ...model.errors import OrchError
from ...model.records import AttemptLaunch

if TYPE_CHECKING:
    from ...spec.config import SlurmSection

# Network filesystems a run folder may be on for the nodes to see it (statfs f_type, from magic.h)
SHARED_FS_TYPES = {
    0x6969: "NFS",
    0x0BD00BD0: "Lustre",
    0x47504653: "GPFS",
    0x19830326: "BeeGFS",
    0x00C36400: "CephFS",
    0xFF534D42: "CIFS",
    0xFE534D42: "SMB2",
    0x5346414F: "AFS",
}


class SlurmError(OrchError, OSError):
    """sbatch refused the job, or the run folder is not shared: the attempt cannot start (an
    OSError too: an executor's `start` raises OSError when it cannot start an attempt)."""


def check_shared(cfg: "SlurmSection", run_dir: Path) -> None:
    """The nodes must see the run folder: it is on a network filesystem, or under one of
    [slurm] shared_dirs (e.g. a single-host cluster, or a filesystem statfs cannot tell)."""
    real = run_dir.resolve()
    for d in cfg.shared_dirs:
        base = Path(os.path.expanduser(d)).resolve()
        if real == base or base in real.parents:
            return
    fs = fs_type(real)
    if fs in SHARED_FS_TYPES:
        return
    kind = f"a local filesystem (type {fs:#x})" if fs is not None else "a filesystem of unknown type"
    raise SlurmError(
        f"the run folder {real} is on {kind}, which the Slurm nodes may not see; put ORCH_HOME on a shared "
        f"filesystem (NFS, Lustre, GPFS, BeeGFS, CephFS), or list the folder in config.toml "
        f"[slurm] shared_dirs if the nodes do see it"
    )


def sbatch_args(cfg: "SlurmSection", launch: AttemptLaunch, job_name: str) -> list[str]:
    spec = launch.spec
    over = spec.get("slurm") or {}
    gpus = int(spec.get("gpus") or 0)
    nodes = int(spec.get("nodes") or 1)
    builtin = not spec.get("command")
    per_node = max(1, gpus) if builtin else 1  # the built-in runner: one rank per GPU
    run = launch.run_dir
    args = [
        f"--job-name={job_name}",
        f"--output={run / attempt_log(launch.attempt)}",
        "--open-mode=append",
        "--no-requeue",
        f"--chdir={launch.cwd or run}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={per_node}",
    ]
    partition = over.get("partition") or cfg.partition
    if partition:
        args.append(f"--partition={partition}")
    for key, value in (("account", cfg.account), ("qos", cfg.qos)):
        if value:
            args.append(f"--{key}={value}")
    walltime = over.get("time") or cfg.time
    if walltime:
        args.append(f"--time={walltime}")
    if cfg.warn_before:
        # all steps (no B:): the tasks checkpoint and exit 75 before the walltime
        args.append(f"--signal=TERM@{int(cfg.warn_before)}")
    if gpus:
        args.append(f"--gres={cfg.gres}:{gpus}")
        if builtin:
            if cfg.cpus_per_gpu:
                args.append(f"--cpus-per-task={cfg.cpus_per_gpu}")
        elif cfg.cpus_per_gpu:
            args.append(f"--cpus-per-task={cfg.cpus_per_gpu * gpus}")
        if cfg.mem_per_gpu:
            args.append(f"--mem-per-gpu={cfg.mem_per_gpu}")
    elif cfg.cpus_per_task:
        args.append(f"--cpus-per-task={cfg.cpus_per_task}")
    args += list(cfg.extra_args) + list(over.get("extra_args") or [])
    return args


def write_script(
    cfg: "SlurmSection", launch: AttemptLaunch, job_name: str, python: str, *, with_secrets: bool = False
) -> Path:
    """The script holds the geometry and the command, never an environment variable's value:
    Slurm shows it (`scontrol write batch_script`) to whoever may see the job."""
    spec = launch.spec
    gpus = int(spec.get("gpus") or 0)
    nodes = int(spec.get("nodes") or 1)
    per_node = max(1, gpus) if not spec.get("command") else 1
    lines = ["#!/bin/bash", f"# orch job {launch.job_id}, attempt {launch.attempt}: written by orch, submitted once"]
    args = sbatch_args(cfg, launch, job_name)
    for a in args:  # job.toml and config.toml refuse these already; a script line is never a second chance
        if control_problem(a, allow_tab=False):
            raise SlurmError(f"an sbatch flag holds a control character ({a[:60]!r}); it would end its #SBATCH line")
    lines += [f"#SBATCH {a}" for a in args]
    cmd = [
        python,
        "-m",
        "orchestrator.executors.slurm.step",
        "batch",
        "--run-dir",
        str(launch.run_dir),
        "--attempt",
        str(launch.attempt),
        "--nodes",
        str(nodes),
        "--ntasks-per-node",
        str(per_node),
    ]
    if launch.cwd:
        cmd += ["--cwd", launch.cwd]
    if with_secrets:
        cmd.append("--with-secrets")  # the daemon wrote the attempt's secret file
    cmd += ["--", *launch.argv]
    lines.append("exec " + shlex.join(cmd))
    path = launch.run_dir / attempt_sbatch(launch.attempt)
    path.write_text("\n".join(lines) + "\n")
    return path


def fs_type(path: Path) -> Optional[int]:
    """statfs(2) f_type of the filesystem holding `path` (Linux), or None."""
    try:
        import ctypes
        import ctypes.util

        class _StatFs(ctypes.Structure):
            _fields_ = [("f_type", ctypes.c_long), ("f_bsize", ctypes.c_long), ("rest", ctypes.c_byte * 256)]

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        buf = _StatFs()
        if libc.statfs(str(path).encode(), ctypes.byref(buf)) != 0:
            return None
        return buf.f_type & 0xFFFFFFFF
    except Exception:
        return None
