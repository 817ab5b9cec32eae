"""The `command` provider: the user's launch command, run with the lost jobs in its environment.
Exit 0 means a machine is coming; anything else (or a command that cannot start) is a failed launch."""

from __future__ import annotations

import os
import subprocess
from typing import Any, Mapping, Optional, Sequence

from orchestrator.recovery.provider import LaunchRequest, RelaunchError

from orchestrator.contract import (
    RECOVERY_ENV_JOBS as ENV_JOBS,
    RECOVERY_ENV_LAUNCH as ENV_LAUNCH,
    RECOVERY_ENV_MARKET as ENV_MARKET,
    RECOVERY_ENV_URL as ENV_URL,
)

TIMEOUT_S = 900.0  # a launch command that has not returned after this long has failed
_TAIL = 600  # characters of the command's output kept in a failure's message


class CommandProvider:
    name = "command"

    def __init__(self, argv: Optional[Sequence[str]], *, timeout_s: float = TIMEOUT_S, cwd: Optional[str] = None):
        if not argv:
            raise RelaunchError("[recovery] launch is empty: name the program to run")
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self.cwd = cwd

    def launch(self, request: LaunchRequest) -> str:
        env = dict(os.environ)
        env[ENV_URL] = request.url
        env[ENV_JOBS] = " ".join(request.job_uids)
        env[ENV_MARKET] = request.market
        env[ENV_LAUNCH] = str(request.launch_number)
        program = self.argv[0]
        try:
            done = subprocess.run(
                self.argv,
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=self.timeout_s,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise RelaunchError(f"launch command {program!r} not found ([recovery] launch)") from None
        except PermissionError:
            raise RelaunchError(f"launch command {program!r} is not executable ([recovery] launch)") from None
        except subprocess.TimeoutExpired:
            raise RelaunchError(f"launch command {program!r} did not return within {self.timeout_s:.0f} s") from None
        except OSError as exc:
            raise RelaunchError(f"launch command {program!r} could not start: {exc.strerror or exc}") from None
        out = done.stdout.decode("utf-8", "replace").strip()
        if done.returncode != 0:
            tail = out[-_TAIL:]
            raise RelaunchError(
                f"launch command {program!r} exited with {done.returncode}" + (f": {tail}" if tail else "")
            )
        last = out.splitlines()[-1][:200] if out else ""
        return last or f"{program} exited 0"

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        return None  # a launch command cannot tell: the silent lease decides
