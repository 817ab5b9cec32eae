"""The `command` provider: the user's launch command, run with the lost jobs in its environment; the
user's stop command and alive command, run with the machine in ORCH_RECOVERY_INSTANCE. Each runs
in a process group of its own, killed whole at its limit or when `orch watch` exits (groups.py).

launch: exit 0 means a machine is coming; its id is the line `instance=<id>` in its output, else
its whole last line (provider.launched_from_output); exit 69 (EX_UNAVAILABLE) means no capacity on
that market now -- a market signal, not a failure; anything else, or a command that cannot start
or does not return, is a failed launch.
stop: exit 0 means the machine is stopped; anything else is a failed stop (the controller retries).
alive: exit 0 means the machine still runs, 1 that it is gone, anything else (or no `alive`
configured) that orch cannot tell -- then a silent lease alone decides."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional, Sequence

from orchestrator.contract import (
    RECOVERY_ENV_GPUS as ENV_GPUS,
    RECOVERY_ENV_INSTANCE as ENV_INSTANCE,
    RECOVERY_ENV_JOBS as ENV_JOBS,
    RECOVERY_ENV_LAUNCH as ENV_LAUNCH,
    RECOVERY_ENV_MARKET as ENV_MARKET,
    RECOVERY_ENV_PRICE as ENV_PRICE,
    RECOVERY_ENV_URL as ENV_URL,
    RECOVERY_ENV_ZONE as ENV_ZONE,
    RECOVERY_EXIT_NO_CAPACITY,
)
from orchestrator.recovery import groups
from orchestrator.recovery.provider import (
    Launched,
    LaunchRequest,
    NoCapacity,
    RelaunchError,
    StopError,
    launched_from_output,
)

TIMEOUT_S = 1200.0  # a launch command that has not returned after this long has failed
ALIVE_TIMEOUT_S = 60.0  # an alive command is a question: it answers quickly or "cannot tell"
_TAIL = 600  # characters of the command's output kept in a failure's message
log = logging.getLogger("orch.watch")


class CommandProvider:
    name = "command"

    def __init__(
        self,
        argv: Optional[Sequence[str]],
        *,
        stop_argv: Optional[Sequence[str]] = None,
        alive_argv: Optional[Sequence[str]] = None,
        timeout_s: float = TIMEOUT_S,
        cwd: Optional[str] = None,
    ):
        if not argv:
            raise RelaunchError("[recovery] launch is empty: name the program to run")
        self.argv = list(argv)
        self.stop_argv = list(stop_argv) if stop_argv else None
        self.alive_argv = list(alive_argv) if alive_argv else None
        self.can_stop = self.stop_argv is not None
        self.timeout_s = timeout_s
        self.alive_timeout_s = min(ALIVE_TIMEOUT_S, timeout_s)
        self.cwd = cwd

    def launch(self, request: LaunchRequest) -> Launched:
        env = {
            ENV_URL: request.url,
            ENV_JOBS: " ".join(request.job_uids),
            ENV_MARKET: request.market,
            ENV_LAUNCH: str(request.launch_number),
            ENV_GPUS: str(request.gpus),
        }
        if request.zone:  # [[recovery.zones]]: where, and at what price per hour
            env[ENV_ZONE] = request.zone
            if request.price is not None:
                env[ENV_PRICE] = f"{request.price:g}"
        code, out = _run(self.argv, env, self.cwd, self.timeout_s, "launch", RelaunchError)
        program = self.argv[0]
        if code == RECOVERY_EXIT_NO_CAPACITY:
            raise NoCapacity(f"launch command {program!r}: no {request.market} capacity now (exit 69)" + _tail(out))
        if code != 0:
            raise RelaunchError(f"launch command {program!r} exited with {code}" + _tail(out))
        # A launch that printed nothing still launched (failing it would launch another machine):
        # it is recorded without an id, and said so, since orch can neither stop nor ask about it.
        return launched_from_output(out)

    def stop(self, instance_id: str) -> str:
        if not self.stop_argv:
            raise StopError("no [recovery] stop command: the machine is left to its own idle shutdown")
        code, out = _run(self.stop_argv, {ENV_INSTANCE: instance_id}, self.cwd, self.timeout_s, "stop", StopError)
        if code != 0:
            raise StopError(f"stop command {self.stop_argv[0]!r} exited with {code}" + _tail(out))
        return (out.splitlines()[-1][:200] if out else "") or f"{self.stop_argv[0]} exited 0"

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        """Without [recovery] alive, or without a machine id to ask about: cannot tell (None)."""
        instance = str(owner.get("instance_id") or "")
        if not self.alive_argv or not instance:
            return None
        program = self.alive_argv[0]
        try:
            code, out = _run(
                self.alive_argv, {ENV_INSTANCE: instance}, self.cwd, self.alive_timeout_s, "alive", RelaunchError
            )
        except RelaunchError as exc:
            log.warning("alive command cannot tell whether %s runs: %s", instance, exc)
            return None
        if code == 0:
            return False
        if code == 1:
            return True
        log.warning("alive command %r exited with %d for %s: cannot tell%s", program, code, instance, _tail(out))
        return None


def _run(
    argv: list[str], extra: dict[str, str], cwd: Optional[str], timeout_s: float, what: str, error: type[Exception]
) -> tuple[int, str]:
    """(exit code, output) of `argv` with `extra` in its environment; `error` when it cannot run or
    runs past `timeout_s` (its whole process group killed then)."""
    program = argv[0]
    try:
        return groups.run(argv, {**os.environ, **extra}, cwd, timeout_s)
    except groups.CannotRun as exc:
        raise error(f"{what} command {program!r} {exc} ([recovery] {what})") from None
    except groups.TimedOut:
        raise error(
            f"{what} command {program!r} did not return within {timeout_s:.0f} s (killed, with its children)"
        ) from None


def _tail(out: str) -> str:
    return f": {out[-_TAIL:]}" if out else ""
