"""The `command` provider: the user's launch command, run with the lost jobs in its environment,
and the user's stop command, run with the machine to stop in its environment.

launch: exit 0 means a machine is coming (its last output line names it: the instance id `stop`
is given later); exit 69 (EX_UNAVAILABLE) means no capacity on that market now -- a market signal,
not a failure; anything else, or a command that cannot start or does not return, is a failed launch.
stop: exit 0 means the machine is stopped; anything else is a failed stop (the controller retries)."""

from __future__ import annotations

import os
import subprocess
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
from orchestrator.recovery.provider import LaunchRequest, NoCapacity, RelaunchError, StopError

TIMEOUT_S = 900.0  # a launch command that has not returned after this long has failed
_TAIL = 600  # characters of the command's output kept in a failure's message


class CommandProvider:
    name = "command"

    def __init__(
        self,
        argv: Optional[Sequence[str]],
        *,
        stop_argv: Optional[Sequence[str]] = None,
        timeout_s: float = TIMEOUT_S,
        cwd: Optional[str] = None,
    ):
        if not argv:
            raise RelaunchError("[recovery] launch is empty: name the program to run")
        self.argv = list(argv)
        self.stop_argv = list(stop_argv) if stop_argv else None
        self.can_stop = self.stop_argv is not None
        self.timeout_s = timeout_s
        self.cwd = cwd

    def launch(self, request: LaunchRequest) -> str:
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
        last = out.splitlines()[-1][:200] if out else ""
        return last or f"{program} exited 0"

    def stop(self, instance_id: str) -> str:
        if not self.stop_argv:
            raise StopError("no [recovery] stop command: the machine is left to its own idle shutdown")
        code, out = _run(self.stop_argv, {ENV_INSTANCE: instance_id}, self.cwd, self.timeout_s, "stop", StopError)
        if code != 0:
            raise StopError(f"stop command {self.stop_argv[0]!r} exited with {code}" + _tail(out))
        return (out.splitlines()[-1][:200] if out else "") or f"{self.stop_argv[0]} exited 0"

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        return None  # a launch command cannot tell: the silent lease decides


def _run(
    argv: list[str], extra: dict[str, str], cwd: Optional[str], timeout_s: float, what: str, error: type[Exception]
) -> tuple[int, str]:
    """(exit code, output) of `argv` with `extra` in its environment; `error` when it cannot run."""
    program = argv[0]
    try:
        done = subprocess.run(
            argv,
            env={**os.environ, **extra},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise error(f"{what} command {program!r} not found ([recovery] {what})") from None
    except PermissionError:
        raise error(f"{what} command {program!r} is not executable ([recovery] {what})") from None
    except subprocess.TimeoutExpired:
        raise error(f"{what} command {program!r} did not return within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise error(f"{what} command {program!r} could not start: {exc.strerror or exc}") from None
    return done.returncode, done.stdout.decode("utf-8", "replace").strip()


def _tail(out: str) -> str:
    return f": {out[-_TAIL:]}" if out else ""
