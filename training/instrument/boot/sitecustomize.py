"""orch's bootstrap for a command job with `instrument` set (job.toml): orch puts this folder first
on the job's PYTHONPATH, so Python runs this file at start-up in every process of the job — each
rank that torchrun, `accelerate launch` or deepspeed starts inherits it through the environment.

It costs one small finder at the head of sys.meta_path that answers None at once for every module
except the two that define a Trainer (`transformers.trainer`, Lightning's `trainer.trainer`). When
one of those is imported, its loader is wrapped so that, once the module has run, orch's callback
is attached to the Trainer class (training/instrument/attach.py). Nothing of orch, and nothing of
the frameworks, is imported before that; a program that imports neither runs unchanged.

Standard library only, and the user's own `sitecustomize` (later on sys.path) still runs: this file
hides it, so it runs it."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Where `training` and `orchestrator` live: two folders up (training/instrument/boot/).
_ORCH_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
# The module that defines each Trainer class, and the framework it belongs to.
_TRAINER_MODULES = {
    "transformers.trainer": "transformers",
    "pytorch_lightning.trainer.trainer": "lightning",
    "lightning.pytorch.trainer.trainer": "lightning",
}
_OURS = ("training", "orchestrator")


class _TrainerLoader:
    """The real loader, then orch's attach once the module has run."""

    def __init__(self, loader, framework):
        self._loader = loader
        self._framework = framework

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _attach(module, self._framework)

    def __getattr__(self, name):  # get_source, get_filename, is_package ...: the real loader's
        return getattr(self._loader, name)


class TrainerImportHook:
    """A meta-path finder that acts on the Trainer modules only (a dict lookup for any other name)."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        framework = _TRAINER_MODULES.get(fullname)
        if framework is None:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _TrainerLoader(spec.loader, framework)
                return spec
        return None


class _OrchPackages:
    """When the job's Python is not orch's (LLaMA-Factory in its own venv), orch's two packages are
    found in orch's installation — those two names only, and only after everything else failed."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in _OURS or "." in fullname:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [_ORCH_ROOT])


def _attach(module, framework):
    if _OrchPackages not in sys.meta_path:
        sys.meta_path.append(_OrchPackages)
    try:
        from training.instrument.attach import attach
    except ImportError as exc:  # a `training` package of the program's own hides orch's
        sys.stderr.write(
            f"[orch] instrument: cannot load orch's bootstrap ({exc}); a package named `training` or "
            "`orchestrator` in the program's path hides orch's: rename it, or set instrument = \"off\"\n"
        )
        raise SystemExit(78) from None  # EX_CONFIG: orch's contract module is what could not be loaded
    attach(module, framework)


def _run_next_sitecustomize():
    """The `sitecustomize` this one hides (a conda or distro one, the user's own), run in its place."""
    rest = [p for p in sys.path if p and os.path.abspath(p) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # what site.py does with a failing sitecustomize: a line, then go on
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


if TrainerImportHook not in sys.meta_path:
    sys.meta_path.insert(0, TrainerImportHook)
_run_next_sitecustomize()
