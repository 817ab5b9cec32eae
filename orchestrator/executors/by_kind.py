"""Each attempt is watched and reaped by the executor that started it. The daemon starts new
attempts with the executor config.toml names, but a running job may have been started by another:
an `orch run` beside a Slurm or Ray daemon (a local process, watched by pid), or a cluster job
started before the config changed. ExecutorsByKind is the executor interface over all of them: it
starts with the configured one and sends every call about a job to the executor its row records
(the `executor` column, written when the attempt began), so the tick never learns a new case.

Without it, a Slurm daemon asked squeue about an `orch run` job, found nothing, reaped it as lost
and submitted it again: two copies training into one run folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from ..home.paths import Home
from ..model.records import FOREGROUND, LOCAL, AttemptLaunch, Job

if TYPE_CHECKING:
    from ..spec.config import Config
    from .base import Executor


class ExecutorsByKind:
    """The configured executor for starts; per job, the one recorded on its row."""

    def __init__(self, config: "Config", home: Home, configured: "Executor", build: Callable[[str], "Executor"]):
        self.config, self.home = config, home
        self.configured = configured
        self.name = configured.name
        self._build = build  # kind -> a new executor of that kind (only when a job needs it)
        self._by_kind: dict[str, "Executor"] = {configured.name: configured}

    def kind_of(self, job: Job) -> str:
        """The executor that started this job's attempt. A row written before the column was
        (always "local") with a handle that is not a local process is the configured executor's."""
        kind = job.executor or LOCAL
        if kind == FOREGROUND:
            return LOCAL  # `orch run`'s attempt is a local process: its pid is the handle
        if kind == LOCAL and not job.supervisor_pid and job.executor_ref and not job.in_foreground:
            return self.configured.name
        return kind

    def for_job(self, job: Job) -> "Executor":
        kind = self.kind_of(job)
        if kind not in self._by_kind:
            self._by_kind[kind] = self._build(kind)
        return self._by_kind[kind]

    # -- the Executor interface ------------------------------------------------------------------

    def start(self, launch: AttemptLaunch) -> dict[str, Any]:
        return self.configured.start(launch)

    def _by_executor(self, jobs: Sequence[Job]) -> list[tuple["Executor", list[Job]]]:
        """The jobs grouped by the executor that watches them; the configured one always listed."""
        groups: dict[str, list[Job]] = {self.configured.name: []}
        for job in jobs:
            groups.setdefault(self.kind_of(job), []).append(job)
        return [
            (self._by_kind.get(kind) or self.for_job(some[0]), some)
            for kind, some in groups.items()
            if kind == self.configured.name or some
        ]

    def exchange(self, jobs: Sequence[Job], now: float) -> None:
        for executor, some in self._by_executor(jobs):
            executor.exchange(some, now)

    def refresh(self, jobs: Sequence[Job], now: float) -> None:
        for executor, some in self._by_executor(jobs):
            executor.refresh(some, now)

    def adopt(self, job: Job) -> Optional[dict[str, Any]]:
        return self.for_job(job).adopt(job)

    def alive(self, job: Job) -> bool:
        return self.for_job(job).alive(job)

    def exit(self, job: Job) -> Optional[dict[str, Any]]:
        return self.for_job(job).exit(job)

    def terminate(self, job: Job) -> bool:
        return self.for_job(job).terminate(job)

    def kill(self, job: Job) -> bool:
        return self.for_job(job).kill(job)

    def clear_lost(self, job: Job) -> None:
        self.for_job(job).clear_lost(job)

    def dump_stacks(self, job: Job) -> str:
        return self.for_job(job).dump_stacks(job)

    def log_paths(self, job: Job) -> list[Path]:
        return self.for_job(job).log_paths(job)

    def describe(self, job: Job) -> Optional[str]:
        return self.for_job(job).describe(job)

    def billable(self, job: Job) -> bool:
        return self.for_job(job).billable(job)

    def notice(self, job: Job) -> Optional[str]:
        return self.for_job(job).notice(job)

    def cluster_gpus(self) -> Optional[tuple[float, float]]:
        return self.configured.cluster_gpus()

    def gpu_room(self, now: float) -> Optional[tuple[int, str]]:
        return self.configured.gpu_room(now)  # new attempts start with the configured executor
