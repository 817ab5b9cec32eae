"""The executor seam: how the daemon's tick starts, watches, signals and reaps attempts without
knowing where they run. `local` runs a supervisor process per attempt on this machine; a cluster
executor (Slurm) implements the same methods. Every executor keeps the job-process contract
(orchestrator/contract.py), so resume, cost and notifications work the same everywhere.

An attempt is named by the job record: its id, `attempt` (the number), its run folder, and the
handle the executor returned from `start` (stored on the job row by the tick)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

from ..model.records import AttemptLaunch, Job

__all__ = ["AttemptLaunch", "Executor"]


class Executor(Protocol):
    name: str  # its kind: what it declares (billing, GPUs, nodes, doctor) is model/executor_kinds.py's

    def start(self, launch: AttemptLaunch) -> dict[str, Any]:
        """Start the attempt. Returns the job-row columns that name it (its handle), which the
        tick stores as they are. Raises OSError when it cannot be started at all."""

    def exchange(self, jobs: Sequence[Job], now: float) -> None:
        """The network half, run by the daemon on its own thread OFF the tick's lock, with a bound
        (daemon/executor_io.py): send the starts and stops the tick asked for, then one batched
        look at the cluster (a Ray head's job list; local: nothing). Whatever it waits on, a
        preemption notice still reaches every job the daemon can signal. What it heard is applied
        by the next `refresh`; no other method calls the network."""

    def refresh(self, jobs: Sequence[Job], now: float) -> None:
        """Once per tick, under the tick's lock, before the other calls: what the last exchange
        heard applied to every tracked attempt (local: collect exited children). No network."""

    def adopt(self, job: Job) -> Optional[dict[str, Any]]:
        """A running job whose handle was never recorded (the daemon died between start and
        record): the handle, if the attempt can still be found; else None."""

    def alive(self, job: Job) -> bool:
        """The attempt may still run (pending counts as alive). Never False on "cannot tell"."""

    def exit(self, job: Job) -> Optional[dict[str, Any]]:
        """The attempt's exit record `{"code", "signal", "started_at", "ended_at"}`, or None."""

    def terminate(self, job: Job) -> bool:
        """ "Checkpoint now, then exit": SIGTERM to the job's processes, SIGKILL after its grace."""

    def kill(self, job: Job) -> bool:
        """Stop the attempt now, without a checkpoint (the grace is over)."""

    def clear_lost(self, job: Job) -> None:
        """The attempt is lost (no exit record, no supervisor): make sure none of its processes
        outlives the requeue, waiting (bounded) until they are gone."""

    def dump_stacks(self, job: Job) -> str:
        """The hang watchdog: write the attempt's Python stacks into its log, without stopping it
        (the built-in runner dumps on SIGUSR1 via faulthandler; other jobs through py-spy when it
        is installed). Returns a few words on what was done, for the `hang` event."""

    def log_paths(self, job: Job) -> list[Path]:
        """The attempt's log files (one per rank where there are several)."""

    def describe(self, job: Job) -> Optional[str]:
        """A short word on where the attempt is, for `orch status` (e.g. "PENDING (Resources)")."""

    def billable(self, job: Job) -> bool:
        """Whether a running attempt costs money now (a job pending in a cluster queue does not)."""

    def notice(self, job: Job) -> Optional[str]:
        """Why the attempt's machine is going away, heard by the executor (a Ray node draining for
        a spot preemption): the daemon stops it as for a preemption notice. None: no notice."""

    def cluster_gpus(self) -> Optional[tuple[float, float]]:
        """(GPUs in use, GPUs in all) as the cluster last said (Ray); None where it is not known or
        the GPUs are this machine's. Only words: the dispatch asks gpu_room."""

    def gpu_room(self, now: float) -> Optional[tuple[int, str]]:
        """How many GPUs new attempts may take now, and the words for a GPU job that waits: a
        cluster whose free GPUs the executor can read (Ray), so jobs wait in orch's queue rather
        than in the cluster's. None where the daemon's own GPU slots decide (local, Slurm)."""
