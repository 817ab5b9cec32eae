"""Wheels for a GPU machine that has torch, Lightning and transformers but not the rest of orch's
dependencies (and no network). Standard library + `packaging` only: it runs before any of them
can be imported.

    python -m tools.gpucheck.wheels requirements            # here: name==version, one a line
    python -m tools.gpucheck.wheels plan WHEELS              # there: what would be installed
    python -m tools.gpucheck.wheels install WHEELS TARGET    # there: pip install --target

`requirements` walks the project's dependencies (pyproject.toml) through the versions installed
in THIS environment, for Python 3.12 on Linux, and leaves out the machine's own stack (PROTECTED:
torch, Lightning, transformers and what they are built on, never fetched, never shadowed) and the
big binaries the GPU image already has (MACHINE_HAS).

`install` installs only the wheels whose distribution is missing on the machine or whose
installed version fails a requirement of the project or of another wheel being installed, with
`pip install --no-index --no-deps --target TARGET`: nothing is downloaded, nothing in the
machine's site-packages changes, and TARGET goes first on PYTHONPATH."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterable, Optional

REPO = Path(__file__).resolve().parents[2]

# The machine's stack: never fetched, never installed into the target (a copy on PYTHONPATH would
# shadow the one the machine's torch/transformers were built and tested with).
PROTECTED = {
    "torch",
    "torchvision",
    "torchaudio",
    "triton",
    "pytorch-lightning",
    "lightning",
    "lightning-utilities",
    "torchmetrics",
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "hf-xet",
    "numpy",
    "regex",
    "pip",
    "setuptools",
    "wheel",
    "jax",
    "jaxlib",
}
PROTECTED_PREFIXES = ("nvidia-", "cuda-", "jax-")
# Big binary wheels GPU images ship with already: left out of the fetch to keep wheels/ small
# enough to carry to the GPU machine. Fetch one anyway by naming it on the command
# line of scripts/fetch-wheels.sh (e.g. pyarrow==26.0.1).
MACHINE_HAS = {
    "pyarrow",
    "pandas",
    "aiohttp",
    "yarl",
    "multidict",
    "frozenlist",
    "propcache",
    "aiosignal",
    "aiohappyeyeballs",
    "attrs",
    "pyyaml",
    "charset-normalizer",
    "xxhash",
    "psutil",
    "pillow",
}

TARGET_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_protected(name: str) -> bool:
    n = normalize(name)
    return n in PROTECTED or n.startswith(PROTECTED_PREFIXES)


def project_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """[project] dependencies, read without tomllib (Python 3.10 has none): the list is plain."""
    text = pyproject.read_text()
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.S | re.M)
    if not block:
        raise SystemExit(f"{pyproject}: no [project] dependencies list")
    return re.findall(r'^\s*"([^"]+)"', block.group(1), re.M)


def _applies(req, env: Optional[dict], extra: str = "") -> bool:
    if req.marker is None:
        return True
    e = dict(env or {})
    e["extra"] = extra
    try:
        return req.marker.evaluate(e)
    except Exception:
        return False


def closure(env: dict = TARGET_ENV) -> tuple[dict[str, str], list[str]]:
    """{distribution: installed version} for the project's dependencies and theirs (markers for
    `env`), without PROTECTED ones or MACHINE_HAS ones; plus problems (a dependency not installed
    here)."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    problems: list[str] = []
    todo: list[tuple[str, frozenset]] = []
    for line in project_requirements():
        req = Requirement(line)
        if _applies(req, env):
            todo.append((req.name, frozenset(req.extras)))
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        name, extras = todo.pop()
        key = (normalize(name), extras)
        if key in seen or is_protected(name) or normalize(name) in MACHINE_HAS:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            problems.append(f"{name} is not installed here")
            continue
        found[normalize(name)] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if any(_applies(req, env, x) for x in ("", *extras)):
                todo.append((req.name, frozenset(req.extras)))
    return dict(sorted(found.items())), problems


# -- on the GPU machine ---------------------------------------------------------------------------


def wheel_name_version(path: Path) -> tuple[str, str]:
    parts = path.name.split("-")
    return normalize(parts[0]), parts[1]


def wheel_requires(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode("utf-8", "replace")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def installed_version(name: str) -> Optional[str]:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def plan(wheels: Path, project: Optional[Iterable[str]] = None, installed=installed_version) -> dict:
    """Which wheels in `wheels` to install, and why; requirements nobody can fix are listed in
    "unmet" (the machine's copy is used anyway)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    supported = set(sys_tags())
    files = sorted(Path(wheels).glob("*.whl"))
    by_name: dict[str, Path] = {}
    foreign = []
    for f in files:
        name, _ = wheel_name_version(f)
        if not supported & set(parse_wheel_filename(f.name)[3]):
            foreign.append(f.name)  # built for another Python or platform (pydantic-core cp312 on 3.11)
            continue
        if name in by_name:
            raise SystemExit(f"two wheels of {name} in {wheels}: {by_name[name].name} and {f.name}; keep one")
        by_name[name] = f
    reqs: list[tuple[str, "Requirement"]] = []  # (who asks, requirement)
    for line in project if project is not None else project_requirements():
        req = Requirement(line)
        if _applies(req, None):
            reqs.append(("orch", req))
    chosen: dict[str, str] = {}  # name -> reason
    added: set[str] = set()
    while True:
        for who, req in reqs:
            name = normalize(req.name)
            if name in chosen or is_protected(name) or name not in by_name:
                continue
            have = installed(req.name)
            if have is None:
                chosen[name] = "missing on this machine"
            elif not req.specifier.contains(Version(have), prereleases=True):
                chosen[name] = f"{have} here does not satisfy {who}'s {req.name}{req.specifier}"
        new = [n for n in chosen if n not in added]
        if not new:
            break
        for name in new:
            added.add(name)
            for line in wheel_requires(by_name[name]):
                req = Requirement(line)
                if _applies(req, None):
                    reqs.append((name, req))
    unmet = []
    for who, req in reqs:
        name = normalize(req.name)
        if name in chosen:
            _, version = wheel_name_version(by_name[name])
            if not req.specifier.contains(Version(version), prereleases=True):
                unmet.append(f"{who} wants {req.name}{req.specifier}; the wheel is {version}")
            continue
        have = installed(req.name)
        if have is None:
            unmet.append(f"{who} wants {req.name}{req.specifier}: not installed and no wheel for it")
        elif not req.specifier.contains(Version(have), prereleases=True):
            unmet.append(
                f"{who} wants {req.name}{req.specifier}; this machine has {have}"
                + (" (protected: the machine's copy is kept)" if is_protected(name) else "")
            )
    return {
        "install": {by_name[n].name: why for n, why in sorted(chosen.items())},
        "unmet": sorted(set(unmet)),
        "wheels_available": len(files),
        "not_for_this_python": foreign,
    }


def install(wheels: Path, target: Path) -> dict:
    result = plan(wheels)
    files = [str(Path(wheels) / f) for f in result["install"]]
    if files:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--upgrade",
            "--target",
            str(target),
            *files,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"pip install --target {target} failed:\n{done.stdout}{done.stderr}")
    target.mkdir(parents=True, exist_ok=True)
    (target / "gpucheck-wheels.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpucheck.wheels", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("requirements", help="name==version lines for pip download (run where the project is installed)")
    p = sub.add_parser("plan", help="what install would do")
    p.add_argument("wheels", type=Path)
    p = sub.add_parser("install", help="install the wheels this machine needs into TARGET")
    p.add_argument("wheels", type=Path)
    p.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "requirements":
        found, problems = closure()
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        for name, version in found.items():
            print(f"{name}=={version}")
        return 0
    if args.cmd == "plan":
        print(json.dumps(plan(args.wheels), indent=2))
        return 0
    result = install(args.wheels, args.target)
    for name, why in result["install"].items():
        print(f"[gpu-check] wheel {name}: {why}", file=sys.stderr)
    for line in result["unmet"]:
        print(f"[gpu-check] warning: {line}", file=sys.stderr)
    if not result["install"]:
        print("[gpu-check] every dependency is already satisfied on this machine", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
