"""Checkpoint files of a run: atomic durable writes, the names the contract fixes (the step is in the
name so the daemon can pick one without torch), integrity checks, retention."""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from orchestrator.contract import (  # noqa: F401 (names re-exported to the runner)
    BEST_NAME,
    NOTICE_PREFIX,
    PERIODIC_PREFIX,
    TEMP_MARK,
    fsync_dir,
    notice_name,
    parse_checkpoint_name,
    periodic_name,
    step_checkpoints,
)
from orchestrator.contract import (
    DISK_FULL as DISK_FULL_FILE,
    ENV_ATTEMPT,
    ENV_FAULT_SLOW_SAVE_S,
    ENV_RUN_DIR,
    atomic_file,
    write_json_atomic,
)
from training.exits import RunError
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

log = logging.getLogger(__name__)

# Test-only fault seam: seconds to sleep between writing a checkpoint's temp file and its rename
# (the chaos test kills jobs while a .tmp- file exists). No effect unless set.
FAULT_SLOW_SAVE = ENV_FAULT_SLOW_SAVE_S

# Keys every Lightning training checkpoint has; a file without them cannot resume a run.
EXPECTED_KEYS = ("state_dict", "global_step", "epoch", "loops", "optimizer_states")


def step_of(path: str | Path) -> Optional[int]:
    """The global step in a periodic or notice checkpoint's name; None for any other file."""
    parsed = parse_checkpoint_name(path)
    return parsed.step if parsed else None


def is_notice(path: str | Path) -> bool:
    parsed = parse_checkpoint_name(path)
    return bool(parsed and parsed.notice)


def atomic_torch_save(obj: Any, path: str | Path) -> dict[str, float]:
    """torch.save through contract.atomic_file (temp file, fsync, rename, fsync of the folder): a
    kill at any instant leaves either the old file or the new one, never a torn one. Returns where
    the time went (write_s, fsync_s, rename_s) and the file's size (bytes)."""
    timings: dict[str, float] = {}
    with atomic_file(Path(path), "wb", timings=timings) as fh:
        torch.save(obj, fh)
        if os.environ.get(FAULT_SLOW_SAVE):  # test-only: widen the window a kill mid-write needs
            fh.flush()
            time.sleep(float(os.environ[FAULT_SLOW_SAVE]))
    return timings


class DiskFull(RunError):
    """A checkpoint write found the disk full. The temp file is gone, the previous checkpoint intact."""


class _Counter(io.RawIOBase):
    """A sink that only counts: how big the checkpoint that did not fit is."""

    def __init__(self) -> None:
        self.n = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.n += len(b)
        return len(b)


def disk_full(obj: Any, path: Path, *, certain: bool = False) -> Optional[DiskFull]:
    """Measure what the failed checkpoint needed; if the disk is full (`certain`, or the checkpoint
    is bigger than the free space), write RUN_DIR/disk_full.json for the daemon (the temp file was
    removed, so this small file fits) and return the error to raise; else None."""
    counter = _Counter()
    try:
        torch.save(obj, counter)
    except Exception:  # a measurement only
        pass
    return disk_full_report(path, counter.n, certain=certain)


def disk_full_report(path: Path, needed: int, *, certain: bool, write: bool = True) -> Optional[DiskFull]:
    """The full-disk verdict on a failed save of `path` that needed `needed` bytes (a file, or a
    sharded folder: training/resume/sharded_full.py): None when the disk is not full; else
    disk_full.json written (`write`: the one rank that writes it) and the error to raise."""
    folder = path.parent
    try:
        free: Optional[int] = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if not certain and (free is None or needed <= free):
        return None
    previous = next((p.name for p in list_checkpoints(folder) if p.name != path.name), None)
    info = {
        "attempt": os.environ.get(ENV_ATTEMPT, ""),
        "name": path.name,
        "folder": str(folder),
        "needed_bytes": needed,
        "free_bytes": free,
        "step": step_of(path),
        "previous": previous,
        "at": time.time(),
    }
    run_dir = Path(os.environ.get(ENV_RUN_DIR) or folder.parent)
    if write:
        try:
            write_json_atomic(run_dir / DISK_FULL_FILE, info)
        except OSError as exc:
            print(f"[orch] could not write {DISK_FULL_FILE}: {exc}", file=sys.stderr, flush=True)
    free_text = f"{free / 1e6:.1f} MB" if free is not None else "an unknown amount"
    kept = f"{previous} is intact" if previous else "there is no earlier checkpoint"
    return DiskFull(
        f"disk full: saving {path.name} needed {needed / 1e6:.1f} MB but {folder} has {free_text} free; "
        f"the write was abandoned cleanly and {kept}"
    )


def remove_orphan_temps(ckpt_dir: str | Path) -> list[Path]:
    """Delete temp files left by a writer that was killed mid-save (call at start-up, before
    anything writes)."""
    removed = []
    folder = Path(ckpt_dir)
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        if not entry.name.startswith(TEMP_MARK):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():  # a sharded save's temp folder
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
        except OSError:
            pass
    return removed


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Periodic and notice checkpoints, newest step first (name order, never mtime); at equal
    steps a notice checkpoint comes first. A file, or a sharded checkpoint's folder
    (training/resume/sharded.py); not a link (a transformers.Trainer folder orch only points at)."""
    folder = Path(ckpt_dir)
    if not folder.is_dir():
        return []
    return [p for p, _ in step_checkpoints(folder) if p.is_file() or (p.is_dir() and not p.is_symlink())]


def is_sharded(path: str | Path) -> bool:
    """A sharded checkpoint (a folder written by DCP), not a single file."""
    return Path(path).is_dir()


def load_checkpoint_file(path: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def checkpoint_problem(path: str | Path) -> Optional[str]:
    """Why `path` cannot resume a run, or None when it loads and has the expected keys.
    Loaded with mmap: the zip directory and the pickle are read and checked, the tensor bytes are
    not (a full load does not check them either: torch keeps no checksum it verifies on load), so
    a resumed attempt reads the checkpoint once, in Lightning's restore, instead of twice
    (BERT-base + AdamW: 0.03-0.1 s instead of 0.5-1.8 s). A sharded checkpoint's folder is checked
    for its metadata and every shard (training/resume/sharded.py)."""
    if is_sharded(path):
        from training.resume.sharded import folder_problem

        return folder_problem(path)
    try:
        ckpt = load_checkpoint_file(path, mmap=True)
    except Exception as exc:  # truncated zip, pickle error, permission: all mean "unusable"
        return f"does not load ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
    if not isinstance(ckpt, dict):
        return "is not a Lightning checkpoint (not a dict)"
    missing = [k for k in EXPECTED_KEYS if k not in ckpt]
    if missing:
        return "is missing " + ", ".join(missing)
    return None


def latest_valid_checkpoint(
    ckpt_dir: str | Path, *, prefer: Optional[str | Path] = None, warn: Callable[[str], None] | None = None
) -> Optional[Path]:
    """The newest loadable checkpoint by the step in its name. `prefer` (e.g. ORCH_RESUME_FROM) is
    tried first; corrupt or truncated files are skipped with a warning naming them."""
    warn = warn or (lambda msg: warnings.warn(msg, stacklevel=2))
    candidates: list[Path] = []
    if prefer:
        candidates.append(Path(prefer))
    candidates += [p for p in list_checkpoints(ckpt_dir) if not (prefer and p.resolve() == Path(prefer).resolve())]
    for path in candidates:
        if not (path.is_file() or path.is_dir()):
            warn(f"checkpoint {path} does not exist; looking for an older one")
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        warn(f"skipping checkpoint {path}: it {problem}; falling back to an older one")
    return None


def prune_checkpoints(ckpt_dir: str | Path, keep: int) -> list[Path]:
    """Keep the `keep` newest periodic checkpoints, the newest notice checkpoint and best.ckpt;
    delete the other periodic/notice files. Returns what was deleted."""
    all_ckpts = list_checkpoints(ckpt_dir)
    periodic = [p for p in all_ckpts if not is_notice(p)]
    notices = [p for p in all_ckpts if is_notice(p)]
    doomed = periodic[keep:] + notices[1:]
    for path in doomed:
        try:
            if is_sharded(path):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            pass
    return doomed


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO: durable atomic saves beside the target (Lightning's own writes the
    whole file to memory and moves it from $TMPDIR without fsync), then retention of the folder."""

    def __init__(self, keep: Optional[int] = None):
        super().__init__()
        self.keep = keep
        self.last_save: dict[str, float] = {}  # atomic_torch_save's timings of the latest save
        self._prune_pending: Optional[Path] = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        try:
            self.last_save = atomic_torch_save(checkpoint, path)
        except (OSError, RuntimeError) as exc:
            # torch's zip writer reports ENOSPC as a RuntimeError ("unexpected pos ..."): a failed
            # write is a full disk when the errno says so, or when the checkpoint does not fit.
            full = disk_full(
                checkpoint, Path(path), certain=isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
            )
            if full is None:
                raise
            raise full from None
        if self.keep is not None and step_of(path) is not None:
            if is_notice(path):
                # Deleting the previous notice file (1.3 GB for BERT-base + AdamW: ~0.2 s) does not
                # make this one more durable: OrchCallback calls prune() once the save is reported.
                self._prune_pending = Path(path).parent
            else:
                prune_checkpoints(Path(path).parent, self.keep)

    def load_checkpoint(
        self, path: Any, map_location: Optional[Any] = None, weights_only: Optional[bool] = None
    ) -> Any:
        """Always weights_only: a checkpoint is tensors and plain data (training/resume/rng.py keeps RNG
        states that way), never pickled code, even on a torch whose default is unsafe."""
        return super().load_checkpoint(
            path, map_location=map_location or (lambda storage, loc: storage), weights_only=True
        )

    def prune(self) -> list[Path]:
        """Retention deferred by a notice save; a no-op when nothing is pending."""
        folder, self._prune_pending = self._prune_pending, None
        return prune_checkpoints(folder, self.keep) if folder is not None and self.keep is not None else []

    def remove_checkpoint(self, path: Any) -> None:
        try:
            Path(path).unlink()
        except FileNotFoundError:
            pass


def saved_geometry(path: Optional[Path]) -> dict[str, Any]:
    """What a checkpoint says of the run that wrote it: its micro-batch, accumulation and number of
    ranks (the module's `orch` entry); {} when it says nothing. Reads a sharded checkpoint's small
    meta.pt only, a file through mmap (no tensor bytes)."""
    if path is None:
        return {}
    try:
        if is_sharded(path):
            from training.resume.sharded import load_meta

            data = load_meta(path)
        else:
            data = load_checkpoint_file(path, mmap=True)
    except Exception:  # the restore itself reports an unreadable checkpoint
        return {}
    orch = data.get("orch") if isinstance(data, dict) else None
    return dict(orch) if isinstance(orch, dict) else {}
