"""The rooted error hierarchy. Messages say what happened and what to do; the CLI turns
them into exit codes (SpecError/ConfigError/UsageError -> 2, the rest -> 1)."""

from __future__ import annotations


class OrchError(Exception):
    """Base of every error orch raises on purpose (a store's, Slurm's, a manifest's, a notifier's
    too). `retryable`: whether trying the same thing again later can help (a store outage, a
    notifier's HTTP 5xx); the one word for it."""

    exit_code = 1
    retryable = False


class BadInput(OrchError):
    """The user's input is wrong: exit code 2."""

    exit_code = 2


class SpecError(BadInput):
    """job.toml is invalid. `problems` holds one line per problem, each naming file and field."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ConfigError(SpecError):
    """config.toml is invalid (same shape as SpecError)."""


class UsageError(BadInput):
    """A command-line value is wrong (bad --at, bad id format, ...)."""


class HomeError(BadInput):
    """$ORCH_HOME (or a folder in it) is not safe to use: someone else owns or may write it, or a
    link stands where a run folder belongs."""


class JobNotFound(OrchError):
    def __init__(self, job_id: int):
        self.job_id = job_id
        super().__init__(f"no job {job_id} (see `orch status --all`)")


class InvalidTransition(OrchError):
    def __init__(self, job_id: int, src: str, dst: str, why: str = ""):
        self.job_id, self.src, self.dst = job_id, src, dst
        text = f"job {job_id} is {src}; it cannot become {dst}"
        super().__init__(f"{text}: {why}" if why else text)


class DaemonError(OrchError):
    """The daemon is not running, or another one holds the lock."""
