"""`transformers.Trainer` instrumented from outside the program: every Trainer (and subclass: TRL's
SFTTrainer, LLaMA-Factory's, axolotl's) gets OrchTrainerCallback when it is built, and `train()`
resumes from the newest whole checkpoint when the program passed none of its own — orch's
(ORCH_RESUME_FROM, the links in ORCH_CKPT_DIR) and, from the second attempt on, the program's own
`checkpoint-N` folders in its output_dir, newest first, so a SIGKILL resumes from its last save."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Callable, Optional

from orchestrator.contract import parse_checkpoint_name, step_checkpoints

from training.scripts import job_side
from training.scripts.hf_trainer import CHECKPOINT_PREFIX, OrchTrainerCallback, checkpoint_problem
from training.scripts.job_side import later_attempt, say

_TRAINER_FOLDER = re.compile(rf"^{re.escape(CHECKPOINT_PREFIX)}(\d+)$")
_MARK = "_orch_instrumented"


def own_checkpoints(output_dir: Optional[str]) -> list[tuple[int, Path]]:
    """The program's own `checkpoint-N` folders in its output_dir, with N."""
    folder = Path(output_dir) if output_dir else None
    if folder is None or not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        match = _TRAINER_FOLDER.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return found


def resume_point(output_dir: Optional[str]) -> Optional[str]:
    """The newest whole checkpoint among ORCH_RESUME_FROM, ORCH_CKPT_DIR's links and (on a later
    attempt) the program's own folders, by step; a broken one is named in the log and skipped."""
    candidates: list[tuple[int, Path]] = []
    prefer = job_side.resume_env()
    if prefer is not None:
        parsed = parse_checkpoint_name(prefer)
        candidates.append((parsed.step if parsed else -1, prefer))
    ckpt_dir = job_side.ckpt_dir()
    if ckpt_dir is not None:
        candidates += [(name.step, path) for path, name in step_checkpoints(ckpt_dir)]
    if later_attempt():
        candidates += own_checkpoints(output_dir)
    seen: set[Path] = set()
    for step, path in sorted(candidates, key=lambda c: c[0], reverse=True):
        real = path.resolve()
        if real in seen:
            continue
        seen.add(real)
        problem = checkpoint_problem(path)
        if problem is None:
            say(f"instrument: resuming from {path} (step {step})")
            return str(path)
        say(f"instrument: skipping checkpoint {path}: it {problem}; looking for an older one")
    return None


def _wrap_init(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not any(isinstance(cb, OrchTrainerCallback) for cb in self.callback_handler.callbacks):
            self.add_callback(OrchTrainerCallback())

    return __init__


def _wrap_train(train: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(train)
    def train_(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("resume_from_checkpoint")
        if given is None:
            kwargs.pop("resume_from_checkpoint", None)
            args = (resume_point(getattr(self.args, "output_dir", None)), *args[1:])
        else:
            say(
                f"instrument: the program resumes from its own choice (resume_from_checkpoint={given!r}); "
                "orch's resume point is not used"
            )
        return train(self, *args, **kwargs)

    return train_


def instrument_trainer(trainer_class: type) -> None:
    """Wrap the base class once; subclasses inherit the wrapped __init__ and train."""
    if getattr(trainer_class, _MARK, False):
        return
    trainer_class.__init__ = _wrap_init(trainer_class.__init__)  # type: ignore[misc]
    trainer_class.train = _wrap_train(trainer_class.train)  # type: ignore[attr-defined]
    setattr(trainer_class, _MARK, True)
