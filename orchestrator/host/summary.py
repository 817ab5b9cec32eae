"""What `orch show` and the dashboard say about a job's provenance folder: the baseline's
interpreter, torch and package count, the size of the recorded change, and which files exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..contract import DIFF_PATCH, PACKAGES_TXT, PROVENANCE_FILES, SYSTEM_JSON, provenance_dir, read_json
from .packages import PYTHON, parse_packages


def provenance_summary(run_dir: Path) -> dict[str, Any]:
    folder = provenance_dir(run_dir)
    sizes: dict[str, int] = {}
    for name in PROVENANCE_FILES:
        try:
            sizes[name] = (folder / name).stat().st_size
        except OSError:
            pass
    packages: dict[str, str] = {}
    if PACKAGES_TXT in sizes:
        try:
            packages = parse_packages((folder / PACKAGES_TXT).read_text(encoding="utf-8"))
        except OSError:
            pass
    system = read_json(folder / SYSTEM_JSON) or {}
    runtime: dict[str, Any] = system["runtime"] if isinstance(system.get("runtime"), dict) else {}
    untracked, cut = 0, False
    if DIFF_PATCH in sizes:
        untracked, cut = _diff_notes(folder / DIFF_PATCH)
    return {
        "folder": str(folder),
        "files": sizes,  # name -> bytes, only those that exist
        "bytes": sum(sizes.values()),
        "packages": len([k for k in packages if k != PYTHON]),
        "python": packages.get(PYTHON) or (system.get("python") or {}).get("version"),
        "torch": packages.get("torch"),
        "cuda": runtime.get("cuda"),
        "devices": runtime.get("devices") if runtime else system.get("gpus"),
        "first_attempt": system.get("attempt"),
        "first_host": system.get("host"),
        "packages_error": system.get("packages_error"),
        "diff_untracked": untracked,
        "diff_cut": cut,
    }


def _diff_notes(path: Path) -> tuple[int, bool]:
    """(untracked files listed, whether the diff was cut) from diff.patch's `#` header and tail."""
    untracked, cut = 0, False
    try:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.startswith("#"):
                    break
                if line.startswith("#   ") and not line.startswith("#   ... and"):
                    untracked += 1
            fh.seek(max(0, path.stat().st_size - 300))
            cut = "# orch: cut at" in fh.read()
    except (OSError, ValueError):
        pass
    return untracked, cut


def provenance_lines(p: dict[str, Any], env_changes: list[str], *, width: Optional[int] = None) -> list[str]:
    """`orch show`'s two lines: what was recorded, then whether later attempts ran in the same environment."""
    if not p.get("files"):
        return [
            "  provenance: none yet (not a git checkout; the environment is recorded when its first attempt starts)"
        ]
    what = []
    if p.get("packages"):
        what.append(f"{p['packages']} packages")
    elif p.get("packages_error"):
        what.append(f"no package list ({p['packages_error']})")
    if p.get("python"):
        what.append(f"python {p['python']}")
    if p.get("torch"):
        what.append(f"torch {p['torch']}" + (f" (CUDA {p['cuda']})" if p.get("cuda") else ""))
    if DIFF_PATCH in p["files"]:
        diff = f"diff.patch {_kb(p['files'][DIFF_PATCH])}" + (", cut" if p.get("diff_cut") else "")
        what.append(diff + (f", {p['diff_untracked']} untracked listed" if p.get("diff_untracked") else ""))
    first = f"  provenance: {p['folder']}: " + ", ".join(what)
    since = f"attempt {p.get('first_attempt') or 1}" + (f" on {p['first_host']}" if p.get("first_host") else "")
    if SYSTEM_JSON not in p["files"]:
        second = "  environment: recorded when its first attempt starts"
    elif env_changes:
        second = f"  environment: changed {len(env_changes)} time(s) since {since}; last: {env_changes[-1]}"
    else:
        second = f"  environment: every attempt ran in the environment of {since}"
    if width:
        second = second[: width - 1] + "…" if len(second) > width else second
    return [first, second]


def _kb(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"
