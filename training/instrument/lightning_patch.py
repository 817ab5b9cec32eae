"""`pytorch_lightning.Trainer` instrumented from outside the program: every Trainer is built with
OrchCallback among its callbacks, and `fit()` resumes from the newest loadable checkpoint when the
program passed no `ckpt_path` — orch's (ORCH_RESUME_FROM, ORCH_CKPT_DIR) and, from the second
attempt on, the program's own ModelCheckpoint files, newest first, so a SIGKILL resumes from them."""

from __future__ import annotations

import functools
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from orchestrator.contract import CKPT_SUFFIX, step_checkpoints

from training.scripts import job_side
from training.scripts.job_side import later_attempt, say

_MARK = "_orch_instrumented"
_CKPT_PATH_AT = 4  # fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, ...)


def checkpoint_problem(path: Path) -> Optional[str]:
    """Why `path` cannot be a Lightning checkpoint, or None. torch.save writes a zip whose directory
    is at its end, so a file cut short by a kill has none (torch.load itself would be a second full
    read of a file fit() reads anyway)."""
    if not path.is_file():
        return "is not a file"
    try:
        with zipfile.ZipFile(path) as archive:
            if not any(name.endswith("data.pkl") for name in archive.namelist()):
                return "is not a torch checkpoint"
    except (OSError, zipfile.BadZipFile) as exc:
        return f"is torn or unreadable ({type(exc).__name__})"
    return None


def own_checkpoints(trainer: Any) -> list[Path]:
    """The .ckpt files the program's ModelCheckpoint callbacks write: their dirpath, or Lightning's
    default (<default_root_dir>/lightning_logs/version_*/checkpoints) when they set none."""
    found: list[Path] = []
    for callback in getattr(trainer, "checkpoint_callbacks", None) or []:
        dirpath = getattr(callback, "dirpath", None)
        if dirpath:
            found += Path(dirpath).glob(f"*{CKPT_SUFFIX}")
        else:
            found += Path(trainer.default_root_dir).glob(f"*/version_*/checkpoints/*{CKPT_SUFFIX}")
    return found


def resume_point(trainer: Any) -> Optional[str]:
    """The newest loadable checkpoint by modification time (the program's file names need not say
    their step); ORCH_RESUME_FROM wins a tie."""
    candidates: list[Path] = []
    prefer = job_side.resume_env()
    if prefer is not None:
        candidates.append(prefer)
    ckpt_dir = job_side.ckpt_dir()
    if ckpt_dir is not None:
        candidates += [path for path, _ in step_checkpoints(ckpt_dir)]
    if later_attempt():
        candidates += own_checkpoints(trainer)
    for path in _newest_first(candidates):
        problem = checkpoint_problem(path)
        if problem is None:
            say(f"instrument: resuming from {path}")
            return str(path)
        say(f"instrument: skipping checkpoint {path}: it {problem}; looking for an older one")
    return None


def _newest_first(paths: Iterable[Path]) -> list[Path]:
    seen: dict[Path, tuple[float, int, Path]] = {}
    for order, path in enumerate(paths):
        real = path.resolve()
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = float("-inf")
        seen.setdefault(real, (mtime, -order, path))
    return [path for _, _, path in sorted(seen.values(), key=lambda v: (v[0], v[1]), reverse=True)]


def _with_orch_callback(callbacks: Any) -> list[Any]:
    # imported here, when a Trainer is built: the Trainer's module is imported halfway through
    # `import pytorch_lightning`, before the Callback class the callback needs exists
    from training.scripts.lightning import OrchCallback

    listed = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if not any(isinstance(cb, OrchCallback) for cb in listed):
        listed.append(OrchCallback())
    return listed


def _wrap_init(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["callbacks"] = _with_orch_callback(kwargs.get("callbacks"))
        init(self, *args, **kwargs)

    return __init__


def _wrap_fit(fit: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fit)
    def fit_(self: Any, *args: Any, **kwargs: Any) -> Any:
        positional = len(args) > _CKPT_PATH_AT
        given = args[_CKPT_PATH_AT] if positional else kwargs.get("ckpt_path")
        if given is None:
            point = resume_point(self)
            if positional:
                args = (*args[:_CKPT_PATH_AT], point, *args[_CKPT_PATH_AT + 1 :])
            else:
                kwargs["ckpt_path"] = point
        else:
            say(f"instrument: the program resumes from its own choice (ckpt_path={given!r}); orch's is not used")
        return fit(self, *args, **kwargs)

    return fit_


def instrument_trainer(trainer_class: type) -> None:
    if getattr(trainer_class, _MARK, False):
        return
    trainer_class.__init__ = _wrap_init(trainer_class.__init__)  # type: ignore[misc]
    trainer_class.fit = _wrap_fit(trainer_class.fit)  # type: ignore[attr-defined]
    setattr(trainer_class, _MARK, True)
