"""Which Python a job runs, and what that Python has installed, asked from outside: orch never
imports the job's libraries (the daemon stays light), it runs the job's interpreter with the job's
environment on a few lines of standard library (importlib.metadata)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
PROBE_TIMEOUT_S = 15.0  # it runs in the daemon's tick, before the attempt starts

# Run with the job's interpreter: stdlib only, so it works in any environment that has Python.
_PROBE = r"""
import importlib.metadata as m, json, platform, sys
seen = {}
for d in m.distributions():
    name = d.metadata["Name"]
    if name and name not in seen:  # the first on sys.path wins, as for an import
        seen[name] = d.version
print(json.dumps({"python": platform.python_version(), "implementation": platform.python_implementation(),
                  "executable": sys.executable, "prefix": sys.prefix, "packages": seen, "path": sys.path}))
"""


@dataclass(frozen=True)
class Interpreter:
    path: Optional[str]  # None: orch could not tell which Python the job runs
    how: str  # how it was found, for system.json and the docs' "what orch cannot know"


@dataclass(frozen=True)
class Probe:
    interpreter: Interpreter
    python: str = ""
    implementation: str = ""
    executable: str = ""
    prefix: str = ""
    packages: dict[str, str] = field(default_factory=dict)
    error: str = ""  # why no packages could be listed
    path: tuple[str, ...] = ()  # the interpreter's sys.path: the folders whose change invalidates the listing


# The last listing per interpreter and environment, with the modification times of its sys.path
# folders: installing or removing a distribution changes its folder's, so an unchanged stamp means
# an unchanged list, and the next attempt (or the next job) costs a few stat() calls, not a Python.
_CACHE: dict[tuple[Optional[str], ...], tuple[tuple[Optional[int], ...], Probe]] = {}
ENV_KEYS = (  # the variables that change what a Python finds installed
    "PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "HOME",
    "VIRTUAL_ENV",
)


def _stamp(interp: str, paths: Sequence[str], cwd: Optional[str]) -> tuple[Optional[int], ...]:
    out: list[Optional[int]] = []
    for p in (interp, *[p or (cwd or ".") for p in paths]):
        try:
            out.append(os.stat(p).st_mtime_ns)
        except OSError:
            out.append(None)
    return tuple(out)


def _which(name: str, env: Mapping[str, str], cwd: Optional[str]) -> Optional[str]:
    if os.sep in name:
        path = Path(cwd or ".") / name
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _shebang_python(path: str) -> Optional[str]:
    """A console script's interpreter (`#!/venv/bin/python`), e.g. torchrun's or accelerate's."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if parts and Path(parts[0]).name == "env" and len(parts) > 1:  # #!/usr/bin/env python3
        parts = parts[1:]
    if parts and _PYTHON_NAME.match(Path(parts[0]).name):
        return parts[0]
    return None


def job_interpreter(argv: Sequence[str], env: Mapping[str, str], cwd: Optional[str]) -> Interpreter:
    """The Python the job's command starts: argv[0] when it is a python, the interpreter named in
    argv[0]'s shebang (torchrun, accelerate, a script), else `python3` / `python` on the job's PATH
    (a guess: `bash train.sh` may start any interpreter)."""
    if not argv:
        return Interpreter(None, "no command")
    first = argv[0]
    if _PYTHON_NAME.match(Path(first).name) or Path(first).name.startswith("python3."):
        found = _which(first, env, cwd)
        return Interpreter(found, "the command's interpreter" if found else f"{first!r} not found on the job's PATH")
    found = _which(first, env, cwd)
    if found:
        script = _shebang_python(found)
        if script:
            resolved = _which(script, env, cwd) if not os.path.isabs(script) else script
            return Interpreter(resolved, f"the interpreter of {Path(found).name}'s #! line")
    for name in ("python3", "python"):
        guess = _which(name, env, cwd)
        if guess:
            return Interpreter(guess, f"a guess: {name} on the job's PATH ({Path(first).name} may start another)")
    return Interpreter(None, f"{Path(first).name} is not Python and no python is on the job's PATH")


def probe(interp: Interpreter, env: Mapping[str, str], cwd: Optional[str], timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """The interpreter's version and every distribution importlib.metadata finds with the job's
    environment (PYTHONPATH included). Never raises: a failure is in `error`."""
    if interp.path is None:
        return Probe(interp, error=interp.how)
    key = (interp.path, cwd, *(env.get(k) for k in ENV_KEYS))
    cached = _CACHE.get(key)
    if cached is not None and _stamp(interp.path, cached[1].path, cwd) == cached[0]:
        return cached[1]
    found = _run_probe(interp, env, cwd, timeout_s)
    if not found.error:
        _CACHE[key] = (_stamp(interp.path, found.path, cwd), found)
    return found


def _run_probe(interp: Interpreter, env: Mapping[str, str], cwd: Optional[str], timeout_s: float) -> Probe:
    assert interp.path is not None
    try:
        out = subprocess.run(
            [interp.path, "-c", _PROBE],
            env=dict(env),
            cwd=cwd if cwd and os.path.isdir(cwd) else None,
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Probe(interp, error=f"{interp.path} did not list its packages within {timeout_s:.0f} s")
    except OSError as exc:
        return Probe(interp, error=f"cannot run {interp.path}: {exc.strerror or exc}")
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (ValueError, IndexError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("packages"), dict):
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or [f"exit {out.returncode}"]
        return Probe(interp, error=f"{interp.path} could not list its packages: {tail[0][:300]}")
    return Probe(
        interp,
        python=str(data.get("python") or ""),
        implementation=str(data.get("implementation") or ""),
        executable=str(data.get("executable") or ""),
        prefix=str(data.get("prefix") or ""),
        packages={str(k): str(v) for k, v in data["packages"].items()},
        path=tuple(str(p) for p in data.get("path") or [] if isinstance(p, str)),
    )
