"""`instrument` for command jobs, orch's side: where the bootstrap folder is (it goes first on the
job's PYTHONPATH, so every rank a launcher starts inherits it), which Python the job's command runs,
and the versions of transformers / pytorch-lightning in that Python, checked at submit. The job side
is training/instrument/ (this module only finds its folder; it never imports it)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..contract import ENV_INSTRUMENT, INSTRUMENT_DISTS_OF, INSTRUMENT_SUPPORTED, instrument_version_problem
from ..spec.jobspec import JobSpec

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?$")
_VERSIONS_SCRIPT = (
    "import json, importlib.metadata as m\n"
    "out = {}\n"
    "for d in %r:\n"
    "    try: out[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps(out))\n"
) % (tuple(INSTRUMENT_SUPPORTED),)


def boot_dir() -> Optional[Path]:
    """training/instrument/boot (its sitecustomize.py), found without importing `training`: a
    top-level find_spec reads the file system only."""
    spec = importlib.util.find_spec("training")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "instrument" / "boot"
    return folder if (folder / "sitecustomize.py").is_file() else None


def instrument_env(mode: str, env: Mapping[str, str]) -> dict[str, str]:
    """What an instrumented attempt adds to its environment: the mode, and the bootstrap first on
    PYTHONPATH (before the job's own [env] PYTHONPATH, which stays)."""
    if mode == "off":
        return {}
    folder = boot_dir()
    if folder is None:
        return {}
    rest = env.get("PYTHONPATH")
    return {ENV_INSTRUMENT: mode, "PYTHONPATH": os.pathsep.join([str(folder), *([rest] if rest else [])])}


def job_python(command: Sequence[str], workdir: Optional[str], env: Mapping[str, str]) -> Optional[str]:
    """The interpreter the command runs: the command itself when it is `python…`, else the one in a
    console script's `#!` line (`llamafactory-cli`, `trl`, `accelerate`, `torchrun`). None when it
    cannot be told (a shell script): the job then checks the versions itself when it imports them."""
    first = command[0]
    if os.sep in first:
        path: Optional[str] = str(Path(workdir or ".", first)) if not os.path.isabs(first) else first
    else:
        path = shutil.which(first, path=env.get("PATH"))
    if path is None or not os.path.isfile(path):
        return None
    if _PYTHON_NAME.match(os.path.basename(path)):
        return path
    try:
        with open(path, "rb") as fh:
            line = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not line.startswith("#!"):
        return None
    words = line[2:].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(words[0], path=env.get("PATH")) if words else None
        words = [found] if found else []
    if words and _PYTHON_NAME.match(os.path.basename(words[0])):
        return words[0]
    return None


def installed_versions(python: str, env: Mapping[str, str]) -> Optional[dict[str, str]]:
    """{distribution: version} of the instrumentable frameworks in `python` (None: it would not say)."""
    try:
        ran = subprocess.run(
            [python, "-c", _VERSIONS_SCRIPT], capture_output=True, text=True, timeout=30, env=dict(env)
        )
        found = json.loads(ran.stdout) if ran.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def instrument_problems(spec: JobSpec, label: str) -> list[str]:
    """At submit, one line per reason the job's Python cannot be instrumented as asked."""
    if spec.instrument == "off" or not spec.command:
        return []
    if boot_dir() is None:
        return [f"{label}: instrument: this orch installation has no training/instrument/boot folder; reinstall orch"]
    env = {**os.environ, **spec.env}
    python = job_python(spec.command, spec.workdir, env)
    if python is None:
        return []  # (the bootstrap refuses an unsupported version itself, with exit 78 and one line)
    versions = installed_versions(python, env)
    if versions is None:
        return [f"{label}: instrument: {python} did not say which packages it has; is it a Python 3 interpreter?"]
    wanted = (
        [d for ds in INSTRUMENT_DISTS_OF.values() for d in ds]
        if spec.instrument == "auto"
        else list(INSTRUMENT_DISTS_OF[spec.instrument])
    )
    problems = []
    for dist in wanted:
        if dist not in versions:
            if spec.instrument != "auto":
                problems.append(
                    f"{label}: instrument: {spec.instrument!r}, but {python} has no {dist} installed; "
                    'install it there, or set instrument = "auto" or "off"'
                )
            continue
        problem = instrument_version_problem(dist, versions[dist])
        if problem:
            problems.append(
                f'{label}: instrument: {problem}, in {python}; install a supported one, or set instrument = "off"'
            )
    return problems
