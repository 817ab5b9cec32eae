"""User hooks ([hooks] on_<event> argv lists) and the idle shutdown command.

Both run the user's program directly (never through a shell, so a job name such as
`x; rm -rf /` is only ever data in ORCH_JOB_NAME), in their own process group so a timeout can
kill everything they started, with their output going to the daemon log. Nothing here raises
into the daemon: a missing, failing or hanging hook becomes a logged, failed HookResult.
HookRunner runs hooks on a one-worker ThreadPoolExecutor, in submission order, so the loop never waits.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..contract import (
    HOOK_ENV_EVENT,
    HOOK_ENV_EVENT_DETAIL,
    HOOK_ENV_JOB_ATTEMPT,
    HOOK_ENV_JOB_COST,
    HOOK_ENV_JOB_ID,
    HOOK_ENV_JOB_NAME,
    HOOK_ENV_JOB_STATE,
    HOOK_ENV_RUN_DIR,
)

DEFAULT_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 120.0
KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL to a timed-out hook's process group
OUTPUT_LIMIT = 16_384  # bytes of a hook's output kept and logged (the tail)

# job dict key -> environment variable. Every one is always set ("" when unknown) so a value
# inherited from the daemon's own environment can never pass for the event's.
JOB_ENV = {
    "id": HOOK_ENV_JOB_ID,
    "name": HOOK_ENV_JOB_NAME,
    "state": HOOK_ENV_JOB_STATE,
    "cost": HOOK_ENV_JOB_COST,
    "attempt": HOOK_ENV_JOB_ATTEMPT,
    "run_dir": HOOK_ENV_RUN_DIR,
}


@dataclass(frozen=True)
class HookResult:
    argv: tuple[str, ...]
    event: str
    returncode: int | None = None  # negative: killed by that signal (subprocess convention)
    timed_out: bool = False
    error: str | None = None  # could not start (missing executable, bad argv)
    output: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and self.returncode == 0

    def describe(self) -> str:
        if self.error is not None:
            return self.error
        if self.timed_out:
            return "timed out; its process group was killed"
        if self.returncode is not None and self.returncode < 0:
            return f"terminated by signal {-self.returncode}"
        return f"exit {self.returncode} after {self.duration_s:.1f} s"


def _env_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"  # money: what `orch cost` shows
    return str(getattr(value, "value", value))


def hook_env(
    event: str, job: Mapping[str, Any] | None, env_base: Mapping[str, str], detail: str = ""
) -> dict[str, str]:
    """The hook's environment: the daemon's, plus ORCH_EVENT, ORCH_EVENT_DETAIL and ORCH_JOB_*."""
    env = {k: v for k, v in env_base.items() if k not in JOB_ENV.values()}
    env[HOOK_ENV_EVENT] = event
    env[HOOK_ENV_EVENT_DETAIL] = detail
    for key, name in JOB_ENV.items():
        env[name] = _env_value((job or {}).get(key))
    return env


def _argv_problem(argv: Any) -> str | None:
    if isinstance(argv, (str, bytes)):
        return f'hooks are argv lists such as ["/path/to/script", "arg"], not shell strings (got {argv!r})'
    if not isinstance(argv, (list, tuple)) or not argv:
        return f"a hook needs a non-empty argv list (got {argv!r})"
    if not all(isinstance(arg, str) for arg in argv):
        return f"every argv item must be a string (got {argv!r})"
    return None


def run_hook(
    argv: Sequence[str],
    event: str,
    job: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    log: logging.Logger,
    env_base: Mapping[str, str] = os.environ,
    detail: str = "",
    cwd: Path | None = None,
    kill_grace_s: float = KILL_GRACE_S,
) -> HookResult:
    """Run one hook to completion (or its timeout) and log how it went. Never raises."""
    label = f"hook for {event}" + (f" (job {job.get('id')})" if job and job.get("id") is not None else "")
    problem = _argv_problem(argv)
    if problem is not None:
        log.warning("%s not run: %s", label, problem)
        return HookResult(
            tuple(map(str, argv)) if isinstance(argv, (list, tuple)) else (str(argv),), event, error=problem
        )
    result = _execute(tuple(argv), event, hook_env(event, job, env_base, detail), timeout_s, cwd, kill_grace_s)
    _log_result(log, label, result)
    return result


def _execute(
    argv: tuple[str, ...], event: str, env: dict[str, str], timeout_s: float, cwd: Path | None, kill_grace_s: float
) -> HookResult:
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills its children too
        )
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return HookResult(argv, event, error=f"cannot start {argv[0]!r}: {reason}")
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        out = _kill_group(proc, kill_grace_s)
    text = (out or b"")[-OUTPUT_LIMIT:].decode("utf-8", errors="replace")
    return HookResult(argv, event, proc.returncode, timed_out, None, text, time.monotonic() - started)


def _kill_group(proc: subprocess.Popen, grace_s: float) -> bytes:
    """SIGTERM the hook's process group, SIGKILL it after `grace_s`; return what it printed."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)  # also stragglers that outlived a polite leader
    try:
        out, _ = proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:  # something outside the group still holds the pipe
        proc.kill()
        out = b""
        if proc.stdout is not None:
            proc.stdout.close()
        proc.wait()
    return out or b""


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _log_result(log: logging.Logger, label: str, result: HookResult) -> None:
    level = logging.INFO if result.ok else logging.WARNING
    for line in result.output.splitlines():
        log.log(level, "%s | %s", label, line)
    if result.ok:
        log.info("%s %s: %s", label, list(result.argv), result.describe())
    else:
        log.warning("%s %s failed: %s", label, list(result.argv), result.describe())


def run_shutdown_command(
    argv: Sequence[str],
    log: logging.Logger,
    *,
    timeout_s: float = SHUTDOWN_TIMEOUT_S,
    env_base: Mapping[str, str] = os.environ,
) -> HookResult:
    """[idle] shutdown_command, with the hooks' safety. A failure is loud: the machine keeps billing."""
    log.warning("idle: running the shutdown command %s", list(argv) if isinstance(argv, (list, tuple)) else argv)
    result = run_hook(argv, "idle_shutdown", None, timeout_s=timeout_s, log=log, env_base=env_base)
    if not result.ok:
        log.error(
            "idle shutdown failed (%s): the machine is still up and billing; check [idle] shutdown_command "
            '(on AutoDL: ["/usr/bin/shutdown"]) and that the daemon may run it',
            result.describe(),
        )
    return result


class HookRunner:
    """Runs hooks on one worker thread, in order, so the daemon loop never waits for them.

    `hooks` maps config keys ("on_succeeded", "on_queue_drained", any "on_<event kind>") to argv
    lists. Order matters: an on_succeeded hook finishes before the on_queue_drained that follows.
    """

    def __init__(
        self,
        hooks: Mapping[str, Sequence[str]] | None = None,
        *,
        log: logging.Logger,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        env_base: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.hooks = dict(hooks or {})
        self.log = log
        self.timeout_s = timeout_s
        self.env_base = env_base
        self.cwd = cwd
        # One worker: hooks run in submission order, off the daemon loop.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orch-hooks")
        self._idle = threading.Condition()
        self._pending = 0
        self._closed = False

    def hook_for(self, event: str) -> list[str] | None:
        argv = self.hooks.get(f"on_{event}")
        return list(argv) if argv else None

    def submit_event(
        self, event: str, job: Mapping[str, Any] | None = None, *, detail: str = ""
    ) -> Future[HookResult] | None:
        """Queue the configured hook for `event`; None when there is none."""
        argv = self.hook_for(event)
        return self.submit(argv, event, job, detail=detail) if argv else None

    def submit(
        self, argv: Sequence[str], event: str, job: Mapping[str, Any] | None = None, *, detail: str = ""
    ) -> Future[HookResult]:
        with self._idle:
            if self._closed:
                refused: Future[HookResult] = Future()
                refused.set_result(HookResult(tuple(argv), event, error="the daemon is shutting down; hook not run"))
                return refused
            self._pending += 1
            return self._pool.submit(self._work, list(argv), event, dict(job) if job else None, detail)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every submitted hook has finished; False if `timeout` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting hooks, let the queued ones finish (up to `timeout`); True if all did."""
        with self._idle:
            self._closed = True
        self._pool.shutdown(wait=False)  # the queued hooks still run; none is accepted any more
        return self.wait_idle(timeout)

    def _work(self, argv: list[str], event: str, job: dict | None, detail: str) -> HookResult:
        try:
            return self._run(argv, event, job, detail)
        except Exception:
            self.log.exception("hook for %s crashed the hook runner", event)
            raise
        finally:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def _run(self, argv: list[str], event: str, job: dict | None, detail: str) -> HookResult:
        env_base = os.environ if self.env_base is None else self.env_base
        return run_hook(
            argv, event, job, timeout_s=self.timeout_s, log=self.log, env_base=env_base, detail=detail, cwd=self.cwd
        )
