"""config.toml's [ray]: where the Ray cluster's Jobs API is and what each attempt asks of it, used
when [executor] kind = "ray" (docs/ray.md)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, field_validator

from ..redaction import is_secret_name
from .bounds import control_problem
from .problems import TomlTable

# Ray Jobs keys orch sets itself: a runtime_env passthrough may not change them.
RESERVED_RUNTIME_ENV = ("working_dir", "py_modules")


class RaySection(TomlTable):
    """[ray]: the dashboard's HTTP address (the Jobs REST API) and the resources of each attempt."""

    address: str = "http://127.0.0.1:8265"  # the head's dashboard: `ray job submit --address` takes the same
    entrypoint_num_cpus: Optional[float] = Field(default=None, gt=0)  # CPUs each attempt holds on its node
    memory_gb: Optional[float] = Field(default=None, gt=0)  # memory each attempt holds (Ray's entrypoint_memory)
    runtime_env: dict[str, Any] = {}  # passed to every Ray job as it is (env_vars merged under orch's own)
    poll_seconds: float = Field(default=2.0, gt=0)  # one list of the cluster's jobs per this many seconds
    timeout_seconds: float = Field(default=10.0, gt=0)  # one HTTP request to the head
    # one submit: under load the head answers late, and a submit given up on may have been taken
    # (the same submission id is sent again, and a job Ray already has under it adopted)
    submit_timeout_seconds: float = Field(default=60.0, gt=0)
    # the most GPUs orch keeps submitted at once (and, without the autoscaler, no more than the
    # cluster has free: the rest wait in orch's queue)
    max_gpus: int = Field(default=64, ge=0)
    # true: the cluster grows on demand (Ray's autoscaler), so a job no node can hold yet waits for one;
    # false: such a job fails at its start with the reason, instead of waiting for a node that never comes
    autoscaler: bool = False

    @field_validator("address")
    @classmethod
    def _http(cls, v: str) -> str:
        problem = control_problem(v, allow_tab=False)
        if problem:
            raise ValueError(f"{problem} (got {v!r})")
        if v.startswith("ray://"):
            raise ValueError(
                f"orch talks to Ray's Jobs API over HTTP: give the dashboard's address, e.g. "
                f"'http://HEAD:8265', not the Ray Client's {v!r}"
            )
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError(
                f"must start with http:// or https:// (the head's dashboard, e.g. 'http://HEAD:8265'; got {v!r})"
            )
        return v.rstrip("/")

    @field_validator("runtime_env")
    @classmethod
    def _passthrough(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in RESERVED_RUNTIME_ENV:
            if key in v:
                raise ValueError(
                    f"{key}: not passed through: orch runs each attempt in its run folder, which every node "
                    "must see (docs/ray.md)"
                )
        env_vars = v.get("env_vars", {})
        if not isinstance(env_vars, dict) or not all(isinstance(x, str) for x in env_vars.values()):
            raise ValueError('env_vars: must be a table of strings, e.g. { NCCL_DEBUG = "WARN" }')
        secret = next((name for name in env_vars if is_secret_name(name)), None)
        if secret is not None:  # the value is never echoed
            raise ValueError(
                f"env_vars.{secret}: Ray's dashboard shows every job's runtime_env to anyone who reaches it; "
                f'give it to the jobs that need it with job.toml pass_env = ["{secret}"] instead (docs/ray.md)'
            )
        return v
