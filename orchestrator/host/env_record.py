"""An attempt's environment against the first attempt's: the first one's is written as the
baseline (provenance/packages.txt and system.json), every later one, on this machine or one that
adopted the job, is compared with it before the job starts."""

from __future__ import annotations

import platform
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..contract import (
    PACKAGES_ACCEPTED,
    PACKAGES_TXT,
    SYSTEM_JSON,
    atomic_file,
    provenance_dir,
    read_json,
    write_json_atomic,
)
from .env_observe import Observed, driver_and_gpus
from .interpreter import Probe, job_interpreter, probe
from .packages import Change, changes, describe, packages_text, parse_packages


@dataclass(frozen=True)
class EnvCheck:
    changed: list[Change] = field(default_factory=list)
    detail: str = ""  # the env_changed event's text; "" when nothing changed
    error: str = ""  # why the environment could not be listed (the job still starts)

    @property
    def breaking(self) -> bool:
        return any(c.breaking for c in self.changed)


def system_facts(
    found: Probe, attempt: int, now: float, machine: Optional[tuple[Optional[str], list[str]]] = None
) -> dict[str, Any]:
    """What orch can know from outside the job: its interpreter, the OS, the driver and GPUs, and
    torch's version as installed; the built-in runner adds torch's own CUDA, cuDNN, NCCL and the
    devices it sees (`"runtime"`). `machine`: nvidia-smi's answer when it is known already."""
    driver, gpus = machine if machine is not None else driver_and_gpus()
    torch = next((v for k, v in found.packages.items() if k.lower() == "torch"), None)
    return {
        "attempt": attempt,
        "host": socket.gethostname(),
        "recorded_at": now,
        "python": {
            "version": found.python or None,
            "implementation": found.implementation or None,
            "executable": found.executable or found.interpreter.path,
            "prefix": found.prefix or None,
            "found_as": found.interpreter.how,
        },
        "os": {"system": platform.system(), "release": platform.release(), "platform": platform.platform()},
        "machine": platform.machine(),
        "driver": driver,
        "gpus": gpus,
        "torch": {"version": torch},
        "packages_error": found.error or None,
    }


def check_environment(
    run_dir: Path,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Optional[str],
    attempt: int,
    now: float,
    observed: Optional[Observed] = None,
) -> EnvCheck:
    """Probe the job's interpreter (or take what `observed` learnt for this very launch, off the
    daemon's lock); write the baseline when there is none yet, else compare."""
    folder = provenance_dir(run_dir)
    if observed is not None and not observed.fits(argv, env, cwd):
        observed = None
    found = observed.found if observed is not None else probe(job_interpreter(argv, env, cwd), env, cwd)
    machine = observed.machine if observed is not None else None
    baseline = folder / PACKAGES_TXT
    if found.error:
        if not (folder / SYSTEM_JSON).exists():
            write_json_atomic(folder / SYSTEM_JSON, system_facts(found, attempt, now, machine))
        return EnvCheck(error=found.error)
    text = packages_text(found.python, found.packages)
    try:
        first = baseline.read_text(encoding="utf-8")
    except FileNotFoundError:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_file(baseline, "w") as fh:
            fh.write(text)
        write_json_atomic(folder / SYSTEM_JSON, system_facts(found, attempt, now, machine))
        return EnvCheck()
    except OSError as exc:
        return EnvCheck(error=f"cannot read {baseline}: {exc.strerror or exc}")
    info = read_json(folder / SYSTEM_JSON) or {}
    since = f"attempt {info.get('attempt', 1)}" + (f" on {info['host']}" if info.get("host") else "")
    try:
        first = (folder / PACKAGES_ACCEPTED).read_text(encoding="utf-8")
        since = "the environment accepted with `orch retry --accept-env`"
    except OSError:
        pass
    found_changes = changes(parse_packages(first), parse_packages(text))
    if not found_changes:
        return EnvCheck()
    return EnvCheck(found_changes, describe(found_changes, since))


def accept_environment(run_dir: Path, argv: Sequence[str], env: Mapping[str, str], cwd: Optional[str]) -> str:
    """`orch retry --accept-env`: the environment the job would start in now becomes the one later
    attempts are compared with (packages.txt keeps the first attempt's). An error message, or ""."""
    found = probe(job_interpreter(argv, env, cwd), env, cwd)
    if found.error:
        return found.error
    with atomic_file(provenance_dir(run_dir) / PACKAGES_ACCEPTED, "w") as fh:
        fh.write(packages_text(found.python, found.packages))
    return ""
