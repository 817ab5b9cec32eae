"""Where a job's code came from: the git commit of its folder, whether the tree was dirty, and the
uncommitted change itself (runs/<id>/provenance/diff.patch), recorded at submit so a queued job's
provenance is never a guess."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..contract import DIFF_PATCH, atomic_file, provenance_dir

DIFF_MAX_BYTES = 1024 * 1024  # a bigger change is cut here, with a note saying how big it was
_UNTRACKED_LISTED = 200  # untracked files named in the patch's header (never copied)


@dataclass(frozen=True)
class GitSnapshot:
    commit: Optional[str] = None  # None: not a git checkout (or no git)
    dirty: Optional[bool] = None  # tracked files changed (untracked ones do not count)
    root: str = ""
    untracked: list[str] = field(default_factory=list)
    diff: str = ""  # `git diff HEAD`: staged and unstaged changes of tracked files


def git_snapshot(folder: Path, timeout_s: float = 5.0) -> GitSnapshot:
    """The checkout containing `folder`: commit, dirty flag, untracked files and the diff. Two git
    processes on a clean tree (as before), a third only when there is a change to copy."""

    def git(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(
                ["git", "-C", str(folder), *args],
                capture_output=True,
                encoding="utf-8",
                errors="replace",
                timeout=timeout_s,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    head = git("rev-parse", "HEAD", "--show-toplevel")
    if not head:
        return GitSnapshot()
    commit, _, root = head.strip().partition("\n")
    status = git("status", "--porcelain", "--untracked-files=normal")  # an untracked folder is one line
    if status is None:
        return GitSnapshot(commit.strip(), None, root.strip())
    lines = [line for line in status.splitlines() if line.strip()]
    untracked = [line[3:] for line in lines if line.startswith("??")]
    dirty = len(untracked) < len(lines)
    diff = (git("diff", "HEAD", "--no-color", "--no-ext-diff") or "") if dirty else ""
    return GitSnapshot(commit.strip(), dirty, root.strip(), untracked, diff)


def patch_text(snap: GitSnapshot, max_bytes: int = DIFF_MAX_BYTES) -> str:
    """diff.patch: a header of `#` lines (git apply skips them) naming the checkout, the commit and
    the untracked files, then the diff, cut at max_bytes with a note."""
    head = [f"# orch: uncommitted changes of {snap.root} against {snap.commit}, recorded at submit"]
    if not snap.dirty:
        head.append("# no tracked file was changed")
    if snap.untracked:
        head.append(f"# untracked files ({len(snap.untracked)}; listed, not copied):")
        head += [f"#   {name}" for name in snap.untracked[:_UNTRACKED_LISTED]]
        if len(snap.untracked) > _UNTRACKED_LISTED:
            head.append(f"#   ... and {len(snap.untracked) - _UNTRACKED_LISTED} more")
    body = snap.diff.encode("utf-8", "replace")
    if len(body) > max_bytes:
        cut = body[:max_bytes].decode("utf-8", "ignore")
        cut = cut[: cut.rfind("\n") + 1]
        tail = f"# orch: cut at {max_bytes} bytes; the whole diff was {len(body)} bytes (`git diff HEAD` at submit)\n"
        return "\n".join(head) + "\n" + cut + tail
    return "\n".join(head) + "\n" + snap.diff


def write_diff(run_dir: Path, snap: GitSnapshot) -> Optional[Path]:
    """runs/<id>/provenance/diff.patch for a job submitted from a git checkout; None outside one."""
    if snap.commit is None:
        return None
    folder = provenance_dir(run_dir)
    target = folder / DIFF_PATCH
    try:
        with atomic_file(target, "w") as fh:
            fh.write(patch_text(snap))
    except OSError:  # a full disk: the job still runs; its commit and dirty flag are recorded
        return None
    return target
