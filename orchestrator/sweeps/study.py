"""The one module that imports optuna, and only when a sweep runs: the study of a sweep (its
journal file under $ORCH_HOME/sweeps/<id>/), its sampler and pruner, ask, report and tell.
The sampler is rebuilt before every ask, seeded with the sweep's seed plus the number of trials
already asked, so a proposal depends only on the seed and the study's history: the same after a
daemon restart, and the same on a rerun."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import FrozenTrial, TrialState

from .spec import ParamSpec, SweepSection

optuna.logging.set_verbosity(optuna.logging.WARNING)

JOURNAL = "optuna.journal"


def journal_path(home_root: Path, sweep_id: int) -> Path:
    return home_root / "sweeps" / str(sweep_id) / JOURNAL


def distribution(param: ParamSpec) -> BaseDistribution:
    if param.values is not None:
        return CategoricalDistribution(param.values)
    if param.int_range is not None:
        return IntDistribution(*param.int_range)
    if param.log_uniform is not None:
        return FloatDistribution(*param.log_uniform, log=True)
    assert param.uniform is not None
    return FloatDistribution(*param.uniform)


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler calls study.stop() once every point was tried, which only works inside
    study.optimize; here the sweep counts its own trials, so that call is left out."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        pass


def _sampler(section: SweepSection, asked: int) -> optuna.samplers.BaseSampler:
    seed = None if section.seed is None else section.seed + asked
    if section.sampler == "grid":
        space = {k: p.grid_points() for k, p in section.params.items()}
        return _AskTellGridSampler(space, seed=section.seed)  # type: ignore[arg-type]
    if section.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(section: SweepSection) -> optuna.pruners.BasePruner:
    if section.pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=section.prune_startup_trials, n_warmup_steps=section.prune_after_steps
        )
    if section.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, section.prune_after_steps))
    return optuna.pruners.NopPruner()


class SweepStudy:
    """A sweep's Optuna study, persisted in its journal file (safe across daemon restarts)."""

    def __init__(self, home_root: Path, sweep_id: int, section: SweepSection):
        self.section = section
        path = journal_path(home_root, sweep_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        storage = JournalStorage(JournalFileBackend(str(path)))
        self.study = optuna.create_study(
            study_name=f"sweep-{sweep_id}",
            storage=storage,
            load_if_exists=True,
            direction=section.direction,
            sampler=_sampler(section, 0),
            pruner=_pruner(section),
        )
        self.distributions = {k: distribution(p) for k, p in section.params.items()}

    def trials(self) -> dict[int, FrozenTrial]:
        return {t.number: t for t in self.study.get_trials(deepcopy=False)}

    def ask(self) -> tuple[int, dict[str, Any]]:
        self.study.sampler = _sampler(self.section, len(self.study.get_trials(deepcopy=False)))
        trial = self.study.ask(self.distributions)
        return trial.number, dict(trial.params)

    def report(self, frozen: FrozenTrial, step: int, value: float) -> None:
        """One intermediate value; a step the trial already reported is never reported again."""
        if frozen.state is TrialState.RUNNING and step not in frozen.intermediate_values:
            optuna.trial.Trial(self.study, frozen._trial_id).report(value, step)

    def should_prune(self, number: int) -> bool:
        frozen = self.trials()[number]
        if frozen.state is not TrialState.RUNNING or not frozen.intermediate_values:
            return False
        if frozen.last_step is not None and frozen.last_step < self.section.prune_after_steps:
            return False
        return optuna.trial.Trial(self.study, frozen._trial_id).should_prune()

    def tell(self, number: int, state: str, value: Optional[float]) -> None:
        """Record how a trial ended ("complete" with its value, "pruned" or "fail"), once."""
        frozen = self.trials().get(number)
        if frozen is None or frozen.state is not TrialState.RUNNING:
            return
        if state == "complete" and value is not None:
            self.study.tell(number, value)
        elif state == "pruned":
            self.study.tell(number, state=TrialState.PRUNED)
        else:
            self.study.tell(number, state=TrialState.FAIL)
