"""The job lifecycle vocabulary: states users see, the daemon's intents, event kinds, and the one
table of allowed transitions. Pure: no I/O. store.transition() is the only writer and asks here."""

from __future__ import annotations

from enum import Enum

from .errors import InvalidTransition


class Word(str, Enum):
    """A value stored and printed as its text (enum.StrEnum, which Python 3.10 lacks)."""

    def __str__(self) -> str:
        return self.value


class JobState(Word):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"  # by a budget, or on_env_change = "stop"; resumable with `orch retry`
    PRUNED = "pruned"  # a sweep's pruner stopped it (with a checkpoint); resumable with `orch retry`
    MOVED = "moved"  # another machine adopted it (the mirror's lease): it runs there now; never again here

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_active(self) -> bool:
        return self in (JobState.QUEUED, JobState.RUNNING)


TERMINAL = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED, JobState.PRUNED, JobState.MOVED}
)
# What `orch retry` may put back in the queue here. Not MOVED: the job runs on another machine, and
# running it here too would train it twice.
RETRYABLE = frozenset({JobState.FAILED, JobState.CANCELLED, JobState.STOPPED, JobState.PRUNED})


class Intent(Word):
    """Why the daemon signalled a job; recorded before the signal (outcome.py: 'What ends an attempt')."""

    NONE = ""
    PREEMPT = "preempt"
    CANCEL = "cancel"
    BUDGET = "budget"
    LEASE_LOST = "lease_lost"  # another machine adopted the job (the mirror's owner lease): stop here
    HANG = "hang"  # the hang watchdog stopped it: a charged retry whatever the exit code
    PRUNE = "prune"  # a sweep's pruner judged the trial a loser
    MOVE = "move"  # `orch watch` asked, through the mirror, that the job move market: hand it over here


class AttemptOutcome(Word):
    """How one attempt ended, as `orch show` lists it (the job's state is decided separately)."""

    RUNNING = ""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CHECKPOINTED = "checkpointed"  # exit 75 on its own: resumes, not charged
    OOM = "oom"
    CANCELLED = "cancelled"
    STOPPED = "stopped"
    PRUNED = "pruned"
    MOVED = "moved"  # stopped here because another machine adopted the job
    LOST = "lost"  # no exit record and nothing left running


class EventKind(Word):
    SUBMITTED = "submitted"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"
    PREEMPTED = "preempted"
    RESUMED = "resumed"
    OOM = "oom"
    STOPPED = "stopped"
    CANCELLED = "cancelled"
    NOTICE = "notice"
    QUEUE_DRAINED = "queue_drained"
    IDLE_SHUTDOWN = "idle_shutdown"
    # Not state changes, but part of a job's history in `orch show`.
    CANCEL_REQUESTED = "cancel_requested"
    NOTIFY_FAILED = "notify_failed"
    HANG = "hang"  # the watchdog saw no progress: stacks dumped, the attempt stopped and retried
    DISK_FULL = "disk_full"  # a checkpoint write found the disk full
    ADOPTED = "adopted"  # `orch adopt` took the job over from another machine's mirror
    MIRROR_FAILED = "mirror_failed"  # [storage] unreachable: uploads wait and retry; training goes on
    MIRROR_RECOVERED = "mirror_recovered"
    LEASE_LOST = "lease_lost"  # another machine adopted the job: `moved` here, its manifest left alone
    DIVERGED = "diverged"  # the loss became NaN/inf: beside the `failed` transition, naming the step
    LOSS_FLAT = "loss_flat"  # [train] flat_after_steps: the loss has not improved; the job goes on
    DEADLINE_AT_RISK = "deadline_at_risk"  # the projected finish crossed the job's deadline
    DEADLINE_RECOVERED = "deadline_recovered"  # ... and came back before it
    PRUNED = "pruned"  # a sweep trial stopped by the pruner
    SWEEP_FINISHED = "sweep_finished"  # a sweep's last trial ended: the best trial, its cost, what pruning saved
    ENV_CHANGED = "env_changed"  # an attempt's installed distributions differ from the first attempt's
    # `orch watch`, the recovery controller (its own events, in its own home):
    MACHINE_LOST = "machine_lost"  # a job's owner lease lapsed (silent past stale_after, not released)
    RELAUNCHED = "relaunched"  # the [recovery] provider was asked for a replacement machine (and on which market)
    RELAUNCH_FAILED = "relaunch_failed"  # the provider failed, or the job is left alone (max_launches, budget)
    CAPACITY_WAIT = "capacity_wait"  # the provider had no capacity on that market: the job waits, free
    MARKET_MOVE = "market_move"  # a planned move of a job between markets (from, to, why)
    STOP_FAILED = "stop_failed"  # the provider could not stop a machine orch no longer needs (retried)
    DEADLINE_INFEASIBLE = "deadline_infeasible"  # even on on-demand from now the job ends after its deadline
    UNTRUSTED = (
        "untrusted"  # a manifest unsigned, badly signed, changed after signing or replayed: never launched or adopted
    )


# History-only kinds: part of `orch show`, never a notification or hook.
HISTORY_ONLY = frozenset({EventKind.CANCEL_REQUESTED, EventKind.NOTIFY_FAILED})
# What a notifier or hook may subscribe to, and what a channel gets when it names no events.
SUBSCRIBABLE = tuple(k.value for k in EventKind if k not in HISTORY_ONLY)
# A job that ended, was preempted or needs a look (hung, flat loss), and the machine powering off or
# losing its mirror: what a channel gets when it names no events.
DEFAULT_NOTIFY_EVENTS = frozenset(
    {
        "succeeded",
        "failed",
        "stopped",
        "preempted",
        "idle_shutdown",
        "loss_flat",
        "hang",
        "mirror_failed",
        "lease_lost",
        "deadline_at_risk",
        "sweep_finished",
        "env_changed",
        "machine_lost",
        "relaunched",
        "relaunch_failed",
        "stop_failed",
        "deadline_infeasible",
        "untrusted",
    }
)


Q, R = JobState.QUEUED, JobState.RUNNING
S, F, C, T = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED
P, M = JobState.PRUNED, JobState.MOVED

# src -> the states it may become. A running job going back to queued is a resume
# (preemption, checkpointed exit, OOM, charged retry); a terminal one going back is `orch retry`.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    Q: frozenset({R, C, F, T, M}),  # F: a dependency failed; T: its environment changed (on_env_change = "stop");
    # M: adopted elsewhere while queued here
    R: frozenset({S, F, C, T, P, Q, M}),
    S: frozenset(),
    F: frozenset({Q}),
    C: frozenset({Q}),
    T: frozenset({Q}),
    P: frozenset({Q}),
    M: frozenset(),  # adopted back with `orch adopt --force`, as a new job
}


def allowed(src: JobState, dst: JobState) -> bool:
    return dst in TRANSITIONS[src]


def ensure_allowed(job_id: int, src: JobState | str, dst: JobState | str) -> None:
    src, dst = JobState(src), JobState(dst)
    if not allowed(src, dst):
        why = "it already finished successfully" if src is S else ""
        if src is M:
            why = "another machine adopted it and runs it now"
        raise InvalidTransition(job_id, src.value, dst.value, why)


# -- preemption notices (the providers' words, daemon/preemption.py) ---------------------------

PREEMPT = "preempt"  # the machine is going away: checkpoint and requeue every running job
REBALANCE = "rebalance"  # an early warning (AWS): record a `notice` event, stop nothing
MAINTENANCE = "maintenance"  # host maintenance that ends the VM (GPU VMs cannot live-migrate)

#: Kinds after which running jobs are checkpointed and no new job is started.
STOPPING_KINDS = frozenset({PREEMPT, MAINTENANCE})


def notice_detail(source: str, kind: str, detail: str) -> str:
    """A `notice` event's detail; `notice_kind` reads the kind back (the MTBF counts only stopping ones)."""
    return f"{source}: {kind}: {detail}"


def notice_kind(detail: str) -> str:
    parts = detail.split(": ", 2)
    return parts[1] if len(parts) >= 2 else ""


# What `orch watch` says of a watched job without a machine (recovery/jobview.py names the rest):
# it waits for one (since `waiting_since`), a launch is under way, or it is left alone (a relaunch
# the controller will not make). `orch status` and the dashboard list these (views/recovery.py).
WATCH_WAITING, WATCH_LAUNCHING, WATCH_LEFT_ALONE = "waiting", "launching", "left alone"
WAITING_FOR_A_MACHINE = (WATCH_WAITING, WATCH_LAUNCHING, WATCH_LEFT_ALONE)
