"""A mirrored manifest as untrusted input. Whoever can write the storage writes the manifest (and
the objects it names, so a matching sha256 proves nothing), so `orch adopt` checks every field it
uses here, before it takes a lease, writes a row or creates a file: types and sizes, sha256 as 64
hex digits, checkpoint names through the contract's own parser, object keys under the job's own
prefix, data-file paths relative and inside their folder, the spec through job.toml's model."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..spec.bounds import INT64_MAX, control_problem, name_problem, value_problems
from ..contract import JOB_UID_PATTERN, PROVENANCE_FILES, parse_checkpoint_name
from ..model.errors import OrchError, SpecError
from ..spec.jobspec import spec_from_dict
from ..model.states import AttemptOutcome, JobState
from ..spec.problems import problems_from
from .datafiles import ROLES

VERSION = 1
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # a real one is a few KB; a bigger one is refused unread

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Time = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Money = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Text = Annotated[str, Field(max_length=4000)]


class _Record(BaseModel):
    # Keys an older or newer orch adds are ignored (the version says whether we can read it).
    model_config = ConfigDict(extra="ignore")


def _relative_parts(value: str) -> tuple[str, ...]:
    """The parts of a relative POSIX path without `.`/`..`/empty parts, or ValueError."""
    problem = control_problem(value, allow_tab=False)
    if problem:
        raise ValueError(problem)
    path = PurePosixPath(value)
    if path.is_absolute() or "\\" in value:
        raise ValueError("must be a relative path")
    if any(part in ("..", ".") for part in value.split("/")) or "//" in value:
        raise ValueError("must not contain .., . or empty parts")
    return path.parts


class CheckpointRecord(_Record):
    name: str
    step: Count
    notice: bool = False
    key: str = Field(max_length=1024)
    sha256: Sha256
    bytes: Count
    packed: Optional[Literal["tar"]] = None
    uploaded_at: Optional[Time] = None

    @model_validator(mode="after")
    def _contract_name(self) -> "CheckpointRecord":
        parsed = parse_checkpoint_name(self.name)
        if parsed is None or "/" in self.name or "\\" in self.name:
            raise ValueError(
                f"name: not a checkpoint file name of the form step-<8 digits>.ckpt or "
                f"notice-step-<8 digits>.ckpt (got {self.name[:80]!r})"
            )
        if parsed.step != self.step or parsed.notice != self.notice:
            raise ValueError(f"step: {self.step} (notice {self.notice}) does not match its name {self.name!r}")
        return self


class DataFileRecord(_Record):
    role: Literal[tuple(f"{s}.{k}" for s, k in ROLES)]  # type: ignore[valid-type]
    root: str = Field(min_length=1, max_length=4096)
    rel: str = Field(max_length=4096)
    sha256: Sha256
    bytes: Count
    key: Optional[str] = None

    @field_validator("root")
    @classmethod
    def _root(cls, value: str) -> str:
        problem = control_problem(value, allow_tab=False)
        if problem:
            raise ValueError(problem)
        name = PurePosixPath(value).name  # the downloaded copy's folder name
        if not value.startswith("/") or name in ("", ".", "..") or ".." in value.split("/"):
            raise ValueError(
                f"must be an absolute path without .. ending in a file or folder name (got {value[:80]!r})"
            )
        return value

    @field_validator("rel")
    @classmethod
    def _rel(cls, value: str) -> str:
        if value:
            _relative_parts(value)
        return value

    @model_validator(mode="after")
    def _key(self) -> "DataFileRecord":
        from .datafiles import data_key

        if self.key is not None and self.key != data_key(self.sha256):
            raise ValueError(f"key: must be {data_key(self.sha256)!r}, its sha256's own key (got {self.key[:80]!r})")
        return self


class AttemptRecord(_Record):
    n: Annotated[int, Field(ge=1, le=1_000_000)]
    started_at: Time
    ended_at: Optional[Time] = None
    gpu_ids: list[Annotated[int, Field(ge=0, le=4096)]] = Field(default=[], max_length=4096)
    exit_code: Optional[Annotated[int, Field(ge=-(2**31), le=2**31)]] = None
    exit_signal: Optional[Annotated[int, Field(ge=0, le=1024)]] = None
    outcome: Literal[tuple(o.value for o in AttemptOutcome)] = ""  # type: ignore[valid-type]
    resumed_from_step: Optional[Count] = None
    step_reached: Optional[Count] = None


class Owner(_Record):
    host: Text = ""
    home_id: Text = ""
    pid: Optional[Count] = None
    by: Text = "daemon"
    heartbeat: Optional[Time] = None
    released: bool = False
    instance_id: Optional[Annotated[str, Field(max_length=64)]] = None  # EC2's id of the machine, where known


class MachineRecord(_Record):
    host: Text = ""
    home_id: Text = ""
    market: Literal["", "spot", "on-demand"] = ""
    from_: Optional[Time] = Field(default=None, alias="from")
    to: Optional[Time] = None
    first_step: Optional[Count] = None
    last_step: Optional[Count] = None

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Git(_Record):
    commit: Optional[Annotated[str, Field(pattern=r"^[0-9a-f]{4,64}$")]] = None
    dirty: Optional[bool] = None


class Budget(_Record):
    max_cost: Optional[Money] = None
    max_hours: Optional[Money] = None


class Cost(_Record):
    cost: Money = 0.0
    run_seconds: Money = 0.0
    gpu_seconds: Money = 0.0
    waste_seconds: Money = 0.0
    waste_cost: Money = 0.0
    steps_lost: Count = 0


class Manifest(_Record):
    version: Annotated[int, Field(ge=0, le=VERSION)] = VERSION
    uid: Annotated[str, Field(pattern=JOB_UID_PATTERN)]
    local_id: Optional[Count] = None
    name: str
    state: Literal[tuple(s.value for s in JobState)]  # type: ignore[valid-type]
    reason: Text = ""
    kind: Literal["builtin", "command"] = "builtin"
    gpus: Annotated[int, Field(ge=0, le=64)] = 0
    priority: Annotated[int, Field(ge=-(2**63), le=INT64_MAX)] = 0
    retries: Annotated[int, Field(ge=0, le=1000)] = 0
    failures: Count = 0
    attempt: Count = 0
    spec: dict[str, Any]
    spec_path: Text = ""
    submitted_at: Optional[Time] = None
    started_at: Optional[Time] = None
    finished_at: Optional[Time] = None
    git: Git = Git()
    budget: Budget = Budget()
    cost: Cost = Cost()
    attempts: list[AttemptRecord] = Field(default=[], max_length=100_000)
    batch: Optional[dict[str, Any]] = None
    progress: Optional[dict[str, Any]] = None
    provenance: list[Literal[PROVENANCE_FILES]] = Field(default=[], max_length=len(PROVENANCE_FILES))  # type: ignore[valid-type]
    checkpoints: list[CheckpointRecord] = Field(default=[], max_length=1000)
    result: Optional[dict[str, Any]] = None
    model: Optional[list[Text]] = None
    data_files: list[DataFileRecord] = Field(default=[], max_length=100_000)
    machines: list[MachineRecord] = Field(default=[], max_length=1000)
    owner: Optional[Owner] = None
    written_at: Optional[Time] = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = name_problem(value)
        if problem:
            raise ValueError(f"{problem} (got {value[:80]!r})")
        return value

    @field_validator("spec")
    @classmethod
    def _spec(cls, value: dict[str, Any]) -> dict[str, Any]:
        # The same model as a job.toml: the command, env, workdir and [slurm] rules apply.
        try:
            spec_from_dict(value, "spec")
        except SpecError as exc:
            raise ValueError("; ".join(p.removeprefix("spec: ") for p in exc.problems)) from None
        return value

    @model_validator(mode="after")
    def _keys_under_own_prefix(self) -> "Manifest":
        from .manifest import job_prefix

        own = f"{job_prefix(self.uid)}/checkpoints/"
        for i, c in enumerate(self.checkpoints):
            if not c.key.startswith(own) or "/" in c.key[len(own) :] or control_problem(c.key, allow_tab=False):
                raise ValueError(f"checkpoints[{i}].key: must name an object under {own} (got {c.key[:80]!r})")
        return self


class ManifestError(OrchError, ValueError):
    """A manifest that orch will not act on; the message names the job, the field and the value."""


def parse(raw: bytes, where: str, uid: Optional[str] = None) -> dict[str, Any]:
    """Check a manifest's bytes and return it as plain data (only the fields the model knows).
    `uid`: the folder it was listed under, which it must name."""
    label = f"job {uid[:12]}" if uid else where
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"{label}: {where} is {len(raw)} bytes, more than a manifest's "
            f"{MAX_MANIFEST_BYTES // (1024 * 1024)} MB limit; refused unread"
        )
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ManifestError(f"{label}: {where}: nested too deep") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"{label}: {where}: not a JSON manifest ({exc})") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{label}: {where}: not an orch manifest (not a JSON object)")
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise ManifestError(f"{label}: {where}: written by a newer orch (manifest version {version}); upgrade orch")
    problems = value_problems(data, f"{label}: manifest", finite=False)
    if uid is not None and data.get("uid") != uid:
        problems.append(
            f"{label}: manifest: uid: must be {uid}, the folder it is in (got {str(data.get('uid'))[:40]!r})"
        )
    if not problems:
        try:
            model = Manifest.model_validate(data)
        except ValidationError as exc:
            problems = problems_from(exc, Manifest, f"{label}: manifest")
    if problems:
        raise ManifestError(
            "\n".join(problems[:5])
            + (f"\n(and {len(problems) - 5} more)" if len(problems) > 5 else "")
            + f"\n{label}: refused: {where} does not look like a manifest orch wrote"
        )
    return model.model_dump(mode="json", by_alias=True)
