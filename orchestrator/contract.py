"""The job-process contract, in one place: the exit codes a job answers with, the ORCH_* names it
is given, the files it writes into its run folder, the checkpoint names (with their one parser)
and the atomic JSON write both sides use. Standard library only: `training/` imports it before
torch, the supervisor sits beside every job with it, and the daemon never imports anything heavy.
docs/trainers.md ("The job-process contract") and docs/commands.md ("Where things live")
describe it for people."""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator, NamedTuple, Optional

# -- exit codes --------------------------------------------------------------------------------

EX_OK = 0
EX_FAIL = 1
EX_CHECKPOINTED = 75  # EX_TEMPFAIL: interrupted after a durable checkpoint; requeue and resume
EX_OOM = 76  # out of GPU memory: run again at once with half the micro-batch, twice the accumulation
EX_CONFIG = 78  # EX_CONFIG: a data or configuration error the runner found; the job fails at once, never retried

# -- the environment a job is given ------------------------------------------------------------

ENV_JOB_ID = "ORCH_JOB_ID"
ENV_JOB_UID = "ORCH_JOB_UID"  # the job's global id: the same on every attempt and every machine that adopts it
# What a job uid may be: it names the job's folder in the mirror and goes into a boot script and
# instance tags, so nothing else (orch makes uuid4 hex; an imported job keeps its manifest's).
JOB_UID_PATTERN = r"^[0-9A-Za-z_-]{1,64}$"


def is_job_uid(text: str) -> bool:
    """Whether `text` is a job uid (the whole of it: a trailing newline is not)."""
    return re.fullmatch(JOB_UID_PATTERN, text) is not None


ENV_ATTEMPT = "ORCH_ATTEMPT"  # 1-based, never reset
ENV_RUN_DIR = "ORCH_RUN_DIR"
ENV_CKPT_DIR = "ORCH_CKPT_DIR"
ENV_RESUME_FROM = "ORCH_RESUME_FROM"  # newest checkpoint by the step in its name, or ""
ENV_TENSORBOARD_DIR = "ORCH_TENSORBOARD_DIR"  # config [logging] tensorboard_dir; unset: none
ENV_MTBF_S = "ORCH_MTBF_S"  # the daemon's mean time between preemptions on this machine, when it has seen some
ENV_PROGRESS_EVERY_S = "ORCH_PROGRESS_EVERY_S"  # seconds between progress.json writes (tests poll faster)
ENV_RESUME_CHECKED = "ORCH_RESUME_CHECKED"  # the runner already validated ORCH_RESUME_FROM (DDP children)

# Test-only fault seams a job reads (no effect unless set).
ENV_FAULT_OOM_ABOVE_BATCH = "ORCH_FAULT_OOM_ABOVE_BATCH"  # a micro-batch above this raises CUDA OOM
ENV_FAULT_OOM_AT_STEP = "ORCH_FAULT_OOM_AT_STEP"  # an OOM at this step
ENV_FAULT_SLOW_STEP_S = "ORCH_FAULT_SLOW_STEP_S"  # a sleep per training step: gives signal tests a window
ENV_FAULT_HANG_AT_STEP = "ORCH_FAULT_HANG_AT_STEP"  # attempt 1 blocks forever at this step (hang watchdog)
ENV_FAULT_SLOW_SAVE_S = "ORCH_FAULT_SLOW_SAVE_S"  # a sleep between a checkpoint's temp write and its rename
# A built-in job with gpus = N and fewer GPUs visible runs N CPU processes (DDP over gloo) instead
# of ending with exit 78: how DDP is rehearsed on a machine without GPUs (docs/job-toml.md).
ENV_CPU_FOR_GPUS = "ORCH_GPUS_ON_CPU"
ENV_TRACE_SAMPLES = "ORCH_TRACE_SAMPLES"  # a file: one JSON line per trained micro-batch (sample accounting)
ENV_PROBE_WARMUP = "ORCH_PROBE_WARMUP"  # `orch estimate`'s probe: the step its steady-state clock starts at
ENV_PARAM_PREFIX = "ORCH_PARAM_"  # a sweep trial's parameters, as environment variables of a command job

# -- the environment of `orch watch`'s launch command ([recovery] provider = "command") --------------

RECOVERY_ENV_URL = "ORCH_RECOVERY_URL"  # the mirror
RECOVERY_ENV_JOBS = "ORCH_RECOVERY_JOBS"  # the lost jobs' uids, space-separated
RECOVERY_ENV_MARKET = "ORCH_RECOVERY_MARKET"  # "spot" or "on-demand"
RECOVERY_ENV_LAUNCH = "ORCH_RECOVERY_LAUNCH"  # 1, 2, ... for these jobs
RECOVERY_ENV_GPUS = "ORCH_RECOVERY_GPUS"  # the GPUs the jobs need together (the machine's size)
RECOVERY_ENV_ZONE = "ORCH_RECOVERY_ZONE"  # [[recovery.zones]]: the zone to launch in
RECOVERY_ENV_PRICE = "ORCH_RECOVERY_PRICE"  # ... and its price per hour on the market, where configured
RECOVERY_ENV_INSTANCE = "ORCH_RECOVERY_INSTANCE"  # `[recovery] stop`: the machine to stop (what launch printed)
RECOVERY_EXIT_NO_CAPACITY = 69  # the launch command: no capacity on that market now (EX_UNAVAILABLE)

# -- the environment of a user hook ([hooks] on_<event>) -------------------------------------------

HOOK_ENV_JOB_ID = ENV_JOB_ID
HOOK_ENV_JOB_NAME = "ORCH_JOB_NAME"
HOOK_ENV_JOB_STATE = "ORCH_JOB_STATE"
HOOK_ENV_JOB_COST = "ORCH_JOB_COST"
HOOK_ENV_JOB_ATTEMPT = "ORCH_JOB_ATTEMPT"
HOOK_ENV_RUN_DIR = ENV_RUN_DIR
HOOK_ENV_EVENT = "ORCH_EVENT"
HOOK_ENV_EVENT_DETAIL = "ORCH_EVENT_DETAIL"

# -- orch's own settings from the environment -------------------------------------------------------

ENV_HOME = "ORCH_HOME"  # the state folder (default ~/.orch)
ENV_CONFIG = "ORCH_CONFIG"  # config.toml (default $ORCH_HOME/config.toml)
ENV_SRUN = "ORCH_SRUN"  # the srun a Slurm batch step runs (tests point it elsewhere)
ENV_PREFLIGHT = "ORCH_PREFLIGHT"  # "off": `orch submit` skips the built-in job's pre-flight (the runner still checks)

# A command job's `instrument` (job.toml): orch puts training/instrument/boot on its PYTHONPATH and
# says which framework to attach to here; the bootstrap reads it only once the program imports a
# Trainer (docs/tools-you-did-not-write.md).
ENV_INSTRUMENT = "ORCH_INSTRUMENT"
# The versions the bootstrap is built for, as [lowest, first refused): `orch submit` refuses a job
# whose interpreter has another, and so does the job itself when it imports one (one definition).
INSTRUMENT_SUPPORTED = {"transformers": ((4, 46), (6, 0)), "pytorch-lightning": ((2, 4), (2, 7))}
INSTRUMENT_DISTS_OF = {"transformers": ("transformers",), "lightning": ("pytorch-lightning",)}


def instrument_version_problem(dist: str, version: str) -> Optional[str]:
    """Why `dist` at `version` cannot be instrumented, or None (a range from INSTRUMENT_SUPPORTED)."""
    low, high = INSTRUMENT_SUPPORTED[dist]
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and low <= (int(found.group(1)), int(found.group(2))) < high:
        return None
    shown = f"{low[0]}.{low[1]} up to (not including) {high[0]}.{high[1]}"
    return f"{dist} {version} is not one orch's instrument supports ({shown})"


# -- the run folder ----------------------------------------------------------------------------

JOB_TOML = "job.toml"
PROGRESS = "progress.json"
RESULT = "result.json"
BATCH = "batch.json"  # the OOM path's batch-size history (written by the runner)
CHECKPOINTS = "checkpoints"
MODEL = "model"
METRICS_CSV = "metrics.csv"
TENSORBOARD = "tensorboard"  # the runner's TensorBoard event files, one per attempt
HEALTH = "health.json"  # training health (diverged, loss_flat), written by the runner, read by the daemon
CHECKPOINT_INTERVAL = "checkpoint-interval.json"  # [checkpoint] every = "auto": what it chose and why (runner -> show)
TRACKING = "tracking.json"  # the job's experiment-tracker runs: ids, and why one is not logging (runner -> show, env)
TRACKERS = "trackers"  # where the built-in runner's trackers keep their local files (offline runs, MLflow's file store)
DEFAULT_MTBF_S = 6 * 3600.0  # what orch assumes before it has seen a preemption on a machine
MACHINE_MTBF_SOURCE = "the preemptions this machine's daemon has seen"


def mtbf_choice(mtbf_hours: Optional[float], machine_s: Optional[float], machine_source: str = "") -> tuple[float, str]:
    """The one rule for the MTBF that `every = "auto"` and `orch estimate` use, and why: the job's
    `[checkpoint] mtbf_hours`, else this machine's (the daemon's count: planning/mtbf.py, handed to
    the runner as ORCH_MTBF_S), else orch's assumption of 6 h."""
    if mtbf_hours:
        return mtbf_hours * 3600.0, "job.toml [checkpoint] mtbf_hours"
    if machine_s is not None and machine_s > 0:
        return machine_s, machine_source or MACHINE_MTBF_SOURCE
    return DEFAULT_MTBF_S, "no preemption seen here yet: orch assumes 6 h"


def young_daly(cost_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that balances save stalls against redone work: sqrt(2 x C x M).
    The runner's `every = "auto"` uses it, and `orch estimate` projects with it."""
    import math

    return math.sqrt(2.0 * max(cost_s, 1e-6) * mtbf_s)


JOB_ERROR = "job_error.json"  # with exit 78: {"attempt", "message"}, the deterministic error in the user's words
DISK_FULL = "disk_full.json"  # a checkpoint write found the disk full: needed vs free bytes (runner -> daemon)
# Background periodic checkpoints keep a host copy of the state: its size, the memory it was
# weighed against, and whether it was too big (then saves are synchronous) (runner -> daemon, show).
SNAPSHOT_MEMORY = "snapshot-memory.json"
ENV_SNAPSHOTS_HELD = "ORCH_SNAPSHOTS_HELD_BYTES"  # host memory other running jobs' snapshots hold

# What a job ran with (docs/provenance.md): the first attempt's environment, kept as the baseline
# every later attempt, on any machine, is compared with; the code's uncommitted change at submit.
PROVENANCE = "provenance"
PACKAGES_TXT = "packages.txt"  # "name==version" per installed distribution, sorted; "# python X.Y.Z" first
DIFF_PATCH = "diff.patch"  # `git diff HEAD` at submit, untracked files listed in its header, capped
SYSTEM_JSON = "system.json"  # Python, torch, CUDA, cuDNN, NCCL, driver, GPUs, OS (orch's probe + the runner)
PACKAGES_ACCEPTED = "packages-accepted.txt"  # `orch retry --accept-env`: compared with instead of packages.txt
PROVENANCE_FILES = (PACKAGES_TXT, SYSTEM_JSON, DIFF_PATCH, PACKAGES_ACCEPTED)  # what the mirror carries


def attempt_log(n: int, rank: int = 0) -> str:
    """Attempt n's log; under a multi-node executor each further rank writes its own."""
    return f"attempt-{n}.log" if rank == 0 else f"attempt-{n}.rank-{rank}.log"


_ATTEMPT_LOG = re.compile(r"^attempt-(\d+)(?:\.rank-(\d+))?\.log$")


def parse_attempt_log(name: str | Path) -> Optional[tuple[int, int]]:
    """(attempt, rank) of an attempt log's file name; None for any other file."""
    m = _ATTEMPT_LOG.match(Path(name).name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def attempt_exit(n: int) -> str:
    """`{"code", "signal", "started_at", "ended_at"}`, written by the attempt's supervisor."""
    return f"attempt-{n}.exit"


def attempt_pid(n: int) -> str:
    """`{"supervisor_pid", "supervisor_start", "job_pid", "job_start", "boot_id", "started_at"}`
    (the job's pid is its process group's id; boot_id says under which boot the numbers hold)."""
    return f"attempt-{n}.pid"


def attempt_rank_logs(n: int) -> str:
    """A glob for attempt n's logs of ranks > 0 (see attempt_log)."""
    return f"attempt-{n}.rank-*.log"


def attempt_sbatch(n: int) -> str:
    """The batch script the Slurm executor submitted for attempt n."""
    return f"attempt-{n}.sbatch"


def attempt_submitted(n: int) -> str:
    """The Slurm executor's handle for attempt n, written before it is recorded in the store."""
    return f"attempt-{n}.submitted.json"


def attempt_slurm_info(n: int) -> str:
    """Where attempt n's Slurm batch step started (job id, host, nodes), written by the step."""
    return f"attempt-{n}.slurm.json"


def attempt_ray_info(n: int) -> str:
    """Where attempt n's Ray job started (node, host, pids), written by its step on the node."""
    return f"attempt-{n}.ray.json"


def attempt_secrets(n: int) -> str:
    """Attempt n's secret variables on a cluster, owner-only, read and deleted by its step (host/secret_file.py)."""
    return f"attempt-{n}.secrets.json"


def ray_submission_id(uid: str, n: int) -> str:
    """Attempt n's Ray job: one per attempt, named by orch's global job id and the attempt number,
    so a retried submit, or a daemon that died before recording the handle, finds the same job
    (the Ray executor submits it; `orch show` names it)."""
    return f"orch-{uid}-{n}"


def exit_record(
    code: Optional[int], signal: Optional[int], started_at: float, ended_at: float, **extra: Any
) -> dict[str, Any]:
    """attempt-<n>.exit's content: the exit code (None when a signal ended it), the signal, when
    it started and ended, and what an executor adds (its own ids, what the cluster said)."""
    return {"code": code, "signal": signal, "started_at": started_at, "ended_at": ended_at, **extra}


def write_exit_record(
    run_dir: Path, n: int, code: Optional[int], signal: Optional[int], started_at: float, ended_at: float, **extra: Any
) -> dict[str, Any]:
    """Write attempt n's exit record atomically; returns it."""
    record = exit_record(code, signal, started_at, ended_at, **extra)
    write_json_atomic(Path(run_dir) / attempt_exit(n), record)
    return record


def checkpoint_dir(run_dir: Path) -> Path:
    """RUN_DIR/checkpoints: what ORCH_CKPT_DIR points at."""
    return Path(run_dir) / CHECKPOINTS


def provenance_dir(run_dir: Path) -> Path:
    """RUN_DIR/provenance: packages.txt, diff.patch, system.json."""
    return Path(run_dir) / PROVENANCE


def model_dir(run_dir: Path) -> Path:
    """RUN_DIR/model: the built-in runner's exported model (save_pretrained)."""
    return Path(run_dir) / MODEL


# -- checkpoint names ----------------------------------------------------------------------------

PERIODIC_PREFIX = "step-"
NOTICE_PREFIX = "notice-step-"
BEST_NAME = "best.ckpt"
TEMP_MARK = ".tmp-"  # a writer's temp file beside the checkpoint it is about to become
_CHECKPOINT = re.compile(r"^(notice-)?step-(\d{8,})\.ckpt$")


class CheckpointName(NamedTuple):
    step: int
    notice: bool

    @property
    def order(self) -> tuple[int, int]:
        """Newest first by step; at equal steps a notice checkpoint is at least as fresh."""
        return (self.step, int(self.notice))


CKPT_SUFFIX = ".ckpt"
# Lightning's ModelCheckpoint `filename` (it appends CKPT_SUFFIX): the same name periodic_name makes.
PERIODIC_FILENAME_TEMPLATE = PERIODIC_PREFIX + "{step:08d}"


def periodic_name(step: int) -> str:
    return PERIODIC_FILENAME_TEMPLATE.format(step=step) + CKPT_SUFFIX


def notice_name(step: int) -> str:
    return NOTICE_PREFIX + f"{step:08d}" + CKPT_SUFFIX


def parse_checkpoint_name(name: str | Path) -> Optional[CheckpointName]:
    """The step (and whether it is a notice save) of a periodic or notice checkpoint's file name;
    None for best.ckpt, temp files and anything else."""
    m = _CHECKPOINT.match(Path(name).name)
    return CheckpointName(int(m.group(2)), bool(m.group(1))) if m else None


def step_checkpoints(ckpt_dir: Path) -> list[tuple[Path, CheckpointName]]:
    """Periodic and notice checkpoints in a folder, newest first (by name, never mtime). An entry
    may be a file (Lightning, OrchLoop) or a relative link to a folder (a transformers.Trainer
    `checkpoint-N/`, see training/scripts/hf_trainer.py): whoever copies or measures one must handle both."""
    found = []
    try:
        entries = list(Path(ckpt_dir).iterdir())
    except OSError:
        return []
    for path in entries:
        parsed = parse_checkpoint_name(path.name)
        if parsed is not None:
            found.append((path, parsed))
    found.sort(key=lambda item: item[1].order, reverse=True)
    return found


def newest_checkpoint(ckpt_dir: Path) -> tuple[Optional[Path], Optional[int]]:
    """The newest checkpoint by the step in its name, and that step. The job validates it and
    falls back to an older one if it does not load."""
    found = step_checkpoints(ckpt_dir)
    return (found[0][0], found[0][1].step) if found else (None, None)


# -- experiment trackers: one run per job ---------------------------------------------------------

TRACKER_BACKENDS = ("wandb", "swanlab", "mlflow")


def tracker_run_id(uid: str) -> str:
    """The W&B and SwanLab run id of a job: its uid (letters, digits, - and _, at most 64), which
    both accept as is, so every attempt on every machine names the same run."""
    return uid


def tracker_env(
    uid: str, tracking: Optional[dict[str, Any]], job_name: str, recorded: Optional[dict[str, Any]]
) -> dict[str, str]:
    """The trackers' own variables for an attempt: the run ids (always, so a script that calls
    wandb.init() or swanlab.init() itself continues one run), and with a [tracking] table its
    project, mode and MLflow server. MLflow makes its own run ids: MLFLOW_RUN_ID is the one the
    first attempt recorded in tracking.json (`recorded`), absent until then."""
    if not uid:  # a job recorded before uids existed: nothing to keep one run by
        return {}
    rid = tracker_run_id(uid)
    env = {
        ENV_JOB_UID: uid,
        "WANDB_RUN_ID": rid,
        "WANDB_RESUME": "allow",
        "SWANLAB_RUN_ID": rid,
        "SWANLAB_RESUME": "allow",
    }
    backends_seen = (recorded or {}).get("backends")
    seen = backends_seen.get("mlflow") if isinstance(backends_seen, dict) else None
    mlflow_id = seen.get("run_id") if isinstance(seen, dict) else None
    if isinstance(mlflow_id, str) and re.fullmatch(r"[0-9A-Za-z_-]{1,64}", mlflow_id):
        env["MLFLOW_RUN_ID"] = mlflow_id
    if tracking:
        backends = tracking.get("backends") or []
        project = str(tracking.get("project") or job_name)
        offline = tracking.get("mode") == "offline"
        if "wandb" in backends:
            env["WANDB_PROJECT"] = project
            if offline:
                env["WANDB_MODE"] = "offline"
        if "swanlab" in backends:
            env["SWANLAB_PROJ_NAME"] = project
            if offline:
                env["SWANLAB_MODE"] = "offline"
        if "mlflow" in backends:
            env["MLFLOW_EXPERIMENT_NAME"] = project
            if tracking.get("mlflow_uri"):
                env["MLFLOW_TRACKING_URI"] = str(tracking["mlflow_uri"])
    return env


# -- small JSON files ------------------------------------------------------------------------------


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(
    path: Path, mode: str = "wb", *, timings: Optional[dict[str, float]] = None, **open_kw: Any
) -> Iterator[IO[Any]]:
    """Write `path` all or nothing: the caller writes into a temp file beside it (TEMP_MARK, pid,
    name); on a clean exit it is fsynced, renamed over `path`, and the folder fsynced, so a reader
    sees the old file or the new one, never half of one, even after a power cut. On an error the
    temp file is removed and `path` is untouched. `timings`, when given, receives where the time
    went (seconds: write_s = the caller's writing into the page cache, fsync_s = the file's data to
    disk, rename_s = the rename and the folder's fsync) and the file's size in `bytes`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TEMP_MARK}{os.getpid()}-{path.name}")
    if "b" not in mode:
        open_kw.setdefault("encoding", "utf-8")
    started = time.perf_counter()
    try:
        with open(tmp, mode, **open_kw) as fh:
            yield fh
            fh.flush()
            written = time.perf_counter()
            os.fsync(fh.fileno())
            synced = time.perf_counter()
            size = fh.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
    if timings is not None:
        timings.update(
            write_s=written - started,
            fsync_s=synced - written,
            rename_s=time.perf_counter() - synced,
            bytes=float(size),
        )


def write_json_atomic(path: Path, data: Any) -> None:
    """A small JSON file, all or nothing (atomic_file)."""
    with atomic_file(path, "w") as fh:
        json.dump(data, fh)


def read_json(path: Path) -> Optional[dict[str, Any]]:
    """A JSON object from a file, or None when it is missing, torn or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
