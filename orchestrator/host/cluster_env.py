"""What of an attempt's environment a cluster job is given, and how. A cluster keeps its job
descriptions where others read them (Ray's dashboard serves every runtime_env to whoever reaches
its port; Slurm keeps a job's environment with the job), so:

- the daemon's own environment is never copied: a Ray job has its node's environment, a Slurm job
  the few basics below (Slurm builds a batch job's environment from sbatch's and has no other);
- the variables orch gives the attempt (AttemptLaunch.job_vars: the contract's, the trackers', the
  job's [env] and its pass_env names) go into the job description, unless they are secret;
- a secret one (a name the redaction rule calls a credential, one the job lists in `secret_env`,
  or a value the rule would mask) reaches the job only through the attempt's secret file
  (secret_file.py).

docs/ray.md ("Security") and docs/slurm.md say the same for people."""

from __future__ import annotations

from typing import Any, Mapping

from ..redaction import is_secret_name, redact

# From the daemon's environment, what a Slurm job needs to find its programs, its user's files and
# its interpreter's packages; none of it secret. Anything else a job needs, it names in pass_env.
SLURM_BASICS = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "LD_LIBRARY_PATH",
)


def is_secret(name: str, value: str, spec: Mapping[str, Any]) -> bool:
    """Whether this variable reaches a cluster job only through its secret file: its name says it
    is a credential, the job lists it in secret_env, or its value holds one that the redaction
    rule would mask (an MLflow URI with user:password@, an hf_... token under a plain name)."""
    return is_secret_name(name) or name in (spec.get("secret_env") or ()) or redact(value) != value


def split_secrets(job_vars: Mapping[str, str], spec: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(what may stand in the cluster's job description, what goes through the secret file)."""
    public: dict[str, str] = {}
    secret: dict[str, str] = {}
    for name, value in job_vars.items():
        (secret if is_secret(name, value, spec) else public)[name] = value
    return public, secret


def slurm_basics(environ: Mapping[str, str]) -> dict[str, str]:
    """SLURM_BASICS as the daemon has them."""
    return {name: environ[name] for name in SLURM_BASICS if name in environ}


def missing_pass_env(job_vars: Mapping[str, str], spec: Mapping[str, Any]) -> list[str]:
    """The job's pass_env names the daemon's environment did not have (the job runs without them)."""
    return [name for name in spec.get("pass_env") or () if name not in job_vars]


def missing_note(missing: list[str]) -> str:
    """The attempt log's line for missing_pass_env (names only, never a value)."""
    return (
        f"pass_env names {', '.join(missing)}, which the daemon's environment does not have: the job runs "
        "without them (set them where the daemon starts: `orch daemon stop`, then `orch daemon start`)"
    )
