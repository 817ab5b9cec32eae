"""config.toml -> Config: typed sections with their defaults in one place, validated on load,
every problem reported at once. Every command works with no config file at all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .bounds import control_problem
from ..model.errors import ConfigError
from ..model.executor_kinds import LOCAL, unknown_kind_problem
from ..model.markets import ZONE_NAME
from ..model.states import DEFAULT_NOTIFY_EVENTS, EventKind
from .problems import TomlTable, problems_from
from .ray_section import RaySection
from .storage_section import StorageSection
from .tomlfile import read_toml

EVENT_NAMES = frozenset(k.value for k in EventKind)


class _Section(TomlTable):
    pass


class DaemonSection(_Section):
    cpu_slots: int = Field(default=1, ge=1, le=1024)
    gpus: Union[Literal["auto"], list[int]] = "auto"
    grace_seconds: float = Field(default=25.0, gt=0)
    tick_seconds: float = Field(default=1.0, gt=0, le=60)
    retry_backoff_seconds: float = Field(default=10.0, ge=0)  # doubles per charged retry
    max_retry_backoff_seconds: float = Field(default=300.0, ge=0)
    log_max_mb: float = Field(default=10.0, gt=0)
    log_backups: int = Field(default=3, ge=0)
    # the pre-flight kept warm for `orch submit` (jobs/preflight_server.py): ~0.5 GB of memory
    # for torch and transformers, which a daemon that runs only command jobs may not want
    warm_preflight: bool = True

    @field_validator("gpus")
    @classmethod
    def _indices(cls, v: Any) -> Any:
        if isinstance(v, list) and any(i < 0 for i in v):
            raise ValueError("GPU indices must be 0 or more")
        return v


class PricingSection(_Section):
    currency: str = ""
    gpu_hour: float = Field(default=0.0, ge=0)
    instance_hour: float = Field(default=0.0, ge=0)
    spot: bool = False
    on_demand_gpu_hour: Optional[float] = Field(default=None, ge=0)
    # What a GB leaving the bucket's region costs: a job moved to a zone of another region pays
    # its checkpoint's transfer (the market policy counts it; docs/recovery.md#zones).
    egress_per_gb: float = Field(default=0.0, ge=0)


class BudgetSection(_Section):
    total: Optional[float] = Field(default=None, gt=0)


class PreemptionSection(_Section):
    sources: list[Literal["aws", "gcp", "azure", "file"]] = []
    poll_seconds: float = Field(default=5.0, gt=0)
    on_notice: Literal["wait", "exit"] = "wait"
    timeout_seconds: float = Field(default=1.0, gt=0)
    aws_endpoint: str = "http://169.254.169.254"
    gcp_endpoint: str = "http://metadata.google.internal"
    azure_endpoint: str = "http://169.254.169.254"
    file: str = "preempt-notice"


class IdleSection(_Section):
    shutdown_after_minutes: Optional[float] = Field(default=None, gt=0)
    shutdown_command: list[str] = Field(default=["shutdown", "-h", "now"], min_length=1)
    notify_wait_seconds: float = Field(default=60.0, ge=0)  # how long the last message may take


class HooksSection(BaseModel):
    """`on_<event> = [argv...]` for any event kind; unknown event names are errors."""

    model_config = ConfigDict(extra="allow")
    timeout_seconds: float = Field(default=60.0, gt=0)


class NotifySection(_Section):
    give_up_after_hours: float = Field(default=24.0, gt=0)
    retry_base_seconds: float = Field(default=5.0, ge=0)
    retry_max_seconds: float = Field(default=600.0, gt=0)


class LoggingSection(_Section):
    # Also show each built-in job's TensorBoard files under <dir>/<job name>-<id> (a symlink to the
    # run folder's tensorboard/), e.g. "/root/tf-logs" for AutoDL's panel. None: the run folder only.
    tensorboard_dir: Optional[str] = None


class ExecutorSection(_Section):
    # where attempts run: this machine, a Slurm cluster ([slurm]) or a Ray cluster ([ray]); the kinds
    # are model/executor_kinds.py's table
    kind: str = LOCAL

    @field_validator("kind")
    @classmethod
    def _known(cls, v: str) -> str:
        problem = unknown_kind_problem(v)
        if problem:
            raise ValueError(problem)
        return v


class SlurmSection(_Section):
    """[slurm]: how orch submits attempts when [executor] kind = "slurm" (see docs/slurm.md)."""

    partition: Optional[str] = None  # sbatch --partition (a job.toml [slurm] partition overrides it)
    account: Optional[str] = None  # sbatch --account
    qos: Optional[str] = None  # sbatch --qos
    time: Optional[str] = None  # walltime per attempt, Slurm's format ("4:00:00", "1-00:00:00", minutes)
    warn_before: int = Field(default=120, ge=0)  # seconds before the walltime the tasks get SIGTERM (0: no warning)
    gres: str = "gpu"  # GPUs are asked as --gres=<gres>:<gpus per node> (e.g. "gpu:a100")
    cpus_per_gpu: Optional[int] = Field(default=None, ge=1)  # CPUs per GPU (per rank of the built-in runner)
    cpus_per_task: Optional[int] = Field(default=None, ge=1)  # CPUs of a job with gpus = 0
    mem_per_gpu: Optional[str] = None  # sbatch --mem-per-gpu ("32G")
    extra_args: list[str] = []  # more sbatch flags, verbatim
    poll_seconds: float = Field(default=10.0, gt=0)  # one batched squeue per this many seconds
    slurm_conf: Optional[str] = None  # SLURM_CONF for every Slurm command (None: Slurm's default)
    accounting: Literal["auto", "on", "off"] = "auto"  # sacct for jobs squeue forgot (auto: if the cluster has it)
    shared_dirs: list[str] = []  # folders the nodes see although not on NFS/Lustre/GPFS/BeeGFS/CephFS
    max_gpus: int = Field(default=64, ge=0)  # GPUs orch keeps submitted at once; CPU jobs: [daemon] cpu_slots

    @model_validator(mode="after")
    def _one_line_each(self) -> "SlurmSection":
        # Each value becomes an `#SBATCH` line or a Slurm argument: a newline would start a shell line.
        for field in ("partition", "account", "qos", "time", "gres", "mem_per_gpu", "slurm_conf"):
            value = getattr(self, field)
            problem = control_problem(value, allow_tab=False) if value is not None else None
            if problem:
                raise ValueError(f"{field}: {problem} (got {value!r})")
        for field in ("extra_args", "shared_dirs"):
            for i, value in enumerate(getattr(self, field)):
                problem = control_problem(value, allow_tab=False)
                if problem:
                    raise ValueError(f"{field}[{i}]: {problem} (got {value!r})")
        return self


class RecoveryAwsSection(_Section):
    """[recovery.aws]: EC2 from a launch template (docs/recovery.md)."""

    region: Optional[str] = None  # else AWS_REGION / AWS_DEFAULT_REGION
    launch_template: Optional[str] = None  # the template's name (its user data installs orch)
    endpoint: Optional[str] = None  # an EC2-compatible endpoint (tests: moto on loopback)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError(f"must start with http:// or https:// (got {v!r})")
        return v


class RecoveryZoneSection(_Section):
    """[[recovery.zones]]: one zone the controller may launch in (docs/recovery.md#zones)."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    spot_price: Optional[float] = Field(default=None, gt=0)  # per hour; not set: [pricing]
    on_demand_price: Optional[float] = Field(default=None, gt=0)
    # aws: where to launch in this zone (else [recovery.aws]'s)
    region: Optional[str] = None
    subnet: Optional[str] = None
    launch_template: Optional[str] = None

    @field_validator("name")
    @classmethod
    def _zone_name(cls, v: str) -> str:
        if not ZONE_NAME.fullmatch(v):  # the one definition (model/markets.py): orch show tells zones by it
            raise ValueError(f"letters, digits, '.', '_' and '-' only, starting with a letter or digit (got {v!r})")
        return v


class RecoverySection(_Section):
    """[recovery]: what `orch watch` does when a job's machine is gone (docs/recovery.md)."""

    provider: Literal["command", "aws"] = "command"
    launch: Optional[list[str]] = None  # command provider: argv run with ORCH_RECOVERY_*; exit 0 = coming
    stop: Optional[list[str]] = None  # command provider: argv run with ORCH_RECOVERY_INSTANCE; exit 0 = stopped
    # command provider: argv run with ORCH_RECOVERY_INSTANCE; exit 0 = the machine runs, 1 = gone, else
    # cannot tell. Without it a silent lease alone decides.
    alive: Optional[list[str]] = None
    on_demand_after: int = Field(default=3, ge=0)  # losses of one job before its next machine is on-demand
    max_launches: int = Field(default=10, ge=1)  # launches of a job that never brought it back; then left alone
    poll_seconds: float = Field(default=30.0, gt=0)  # how often the controller reads the mirror
    # A launched machine that has not adopted its job within this long is lost too: the next launch.
    launch_timeout_minutes: float = Field(default=20.0, gt=0)
    # A job without a deadline waits this long for spot capacity before it goes on-demand.
    max_spot_wait_minutes: float = Field(default=60.0, ge=0)
    # A new machine's boot, install and adopt: paid, no progress (with the job's measured resume
    # after adoption, its hand-over, the policy's d).
    changeover_minutes: float = Field(default=12.0, ge=0)
    # How long the controller itself may be away (a restart, a lost host): the deadline's safety
    # net starts this much earlier, so a job it could not watch meanwhile still makes it.
    controller_outage_minutes: float = Field(default=30.0, ge=0)
    # How fast a checkpoint crosses to a zone of another region than the bucket's: the move's
    # extra time without progress (a zone's `region` against [storage] region).
    cross_region_mb_per_second: float = Field(default=50.0, gt=0)
    aws: RecoveryAwsSection = RecoveryAwsSection()
    # Markets in several zones: each launch goes to a (zone, market) pair (none: one market).
    zones: list[RecoveryZoneSection] = []

    @field_validator("zones")
    @classmethod
    def _zones(cls, v: list[RecoveryZoneSection], info: ValidationInfo) -> list[RecoveryZoneSection]:
        seen: set[str] = set()
        for z in v:
            if z.name in seen:
                raise ValueError(f"two zones are named {z.name!r}: names must be unique")
            seen.add(z.name)
            aws_only = [k for k in ("subnet", "launch_template") if getattr(z, k) is not None]
            if aws_only and info.data.get("provider") == "command":
                # the command provider is given ORCH_RECOVERY_ZONE and launches where it likes: never used
                # (`region` is: a zone outside [storage] region pays the checkpoint's transfer)
                raise ValueError(
                    f'zone {z.name!r} sets {", ".join(aws_only)}, which only provider = "aws" uses; the command '
                    "provider is given the zone's name in ORCH_RECOVERY_ZONE: remove them"
                )
        # A zone without a price would rank as free beside a priced one (the cheapest wins): all or none.
        # The aws provider reads an unset spot_price from EC2's spot price history.
        keys = ["on_demand_price"] + (["spot_price"] if info.data.get("provider") != "aws" else [])
        for key in keys:
            unpriced = [z.name for z in v if getattr(z, key) is None]
            if unpriced and len(unpriced) < len(v):
                raise ValueError(
                    f"zone(s) {', '.join(map(repr, unpriced))} set no {key} while others do: give every zone "
                    f"its {key}, or none (then [pricing] prices them all alike)"
                )
        return v

    @field_validator("launch", "stop", "alive")
    @classmethod
    def _launch(cls, v: Optional[list[str]], info: ValidationInfo) -> Optional[list[str]]:
        if v is None:
            return v
        if info.data.get("provider") == "aws":  # the aws provider launches, stops and asks EC2 itself
            raise ValueError('only for provider = "command" (the aws provider never runs it): remove it')
        if not v or not v[0].strip():
            raise ValueError('must name the program to run, e.g. ["bash", "launch.sh"] (got an empty command)')
        for i, arg in enumerate(v):
            problem = control_problem(arg, allow_tab=False)
            if problem:
                raise ValueError(f"[{i}]: {problem} (got {arg!r})")
        return v

    @model_validator(mode="after")
    def _provider_needs(self) -> "RecoverySection":
        if self.provider == "command" and self.launch is None:
            raise ValueError('provider = "command" needs launch = ["program", "args"...]')
        if self.provider == "aws" and not self.aws.launch_template:
            missing = [z.name for z in self.zones if not z.launch_template] if self.zones else ["-"]
            if missing:
                raise ValueError('provider = "aws" needs [recovery.aws] launch_template (or one in every zone)')
        return self


class Config(_Section):
    daemon: DaemonSection = DaemonSection()
    pricing: PricingSection = PricingSection()
    budget: BudgetSection = BudgetSection()
    preemption: PreemptionSection = PreemptionSection()
    idle: IdleSection = IdleSection()
    hooks: HooksSection = HooksSection()
    notify: NotifySection = NotifySection()
    notifiers: list[dict[str, Any]] = []
    storage: StorageSection = StorageSection()
    logging: LoggingSection = LoggingSection()
    executor: ExecutorSection = ExecutorSection()
    slurm: SlurmSection = SlurmSection()
    ray: RaySection = RaySection()
    recovery: Optional[RecoverySection] = None  # None: no [recovery] table (`orch watch` refuses)

    # Set by load_config, not read from the file.
    path: Optional[Path] = Field(default=None, exclude=True)

    def routes(self) -> list[tuple[str, frozenset[str]]]:
        """(channel name, events it wants) for every notifier — enough to queue outbox rows
        without building the notifiers (which needs their secrets)."""
        out = []
        for raw in self.notifiers:
            name = str(raw.get("name") or raw.get("type") or "")
            events = raw.get("events") or DEFAULT_NOTIFY_EVENTS
            out.append((name, frozenset(str(e) for e in events)))
        return out


def _hook_problems(raw: dict[str, Any], label: str) -> list[str]:
    problems: list[str] = []
    hooks = raw.get("hooks")
    if not isinstance(hooks, dict):  # pydantic says "hooks: must be a table"
        return problems
    for key, value in hooks.items():
        if key == "timeout_seconds":
            continue
        if not key.startswith("on_") or key[3:] not in EVENT_NAMES:
            problems.append(
                f"{label}: unknown key 'hooks.{key}' (hooks are on_<event>, events: {', '.join(sorted(EVENT_NAMES))})"
            )
        elif not (isinstance(value, list) and all(isinstance(x, str) and x for x in value)):
            problems.append(
                f"{label}: hooks.{key}: must be a list of strings, the program and its arguments (got {value!r})"
            )
    return problems


def _notifier_shape_problems(raw: dict[str, Any], label: str) -> list[str]:
    # Keys and events of each channel are checked by notifiers.build_notifiers; here only the shape.
    problems: list[str] = []
    items = raw.get("notifiers", [])
    if not isinstance(items, list):
        return [f"{label}: notifiers: must be an array of tables ([[notifiers]])"]
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            problems.append(f"{label}: notifiers[{i}]: must be a table")
    return problems


def load_config(path: Optional[Path] = None, *, required: bool = False) -> Config:
    """Read config.toml; a missing file gives the defaults unless `required`. Only the shape is
    checked here: the secrets it names (notifier keys, storage credentials) are resolved where they
    are used (jobs/notify.py's load_config_checked)."""
    if path is None or (not path.exists() and not required):
        return Config(path=path)
    label = str(path)
    raw = read_toml(path, label, ConfigError)
    problems = _hook_problems(raw, label) + _notifier_shape_problems(raw, label)
    if "path" in raw:  # Config.path is where orch read the file from, not a key of it
        problems.append(f"{label}: unknown key 'path'")
        raw = {k: v for k, v in raw.items() if k != "path"}
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        problems += problems_from(exc, Config, label)
        config = None
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    assert config is not None
    config.path = path
    return config


def preemption_file(config: Config, home_root: Path) -> Path:
    return (home_root / os.path.expanduser(config.preemption.file)).resolve()
