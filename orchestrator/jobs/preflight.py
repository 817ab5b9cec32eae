"""The pre-flight at submit, from the CLI's side: the built-in job's data, tokenizer, model
configuration, LoRA modules and metrics are checked by `python -m training.preflight` (the CLI
never imports the training stack) before anything is queued. Its problems refuse the job (exit 2);
a pre-flight that cannot finish is a note, not a refusal: the runner checks the same at run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..contract import ENV_PREFLIGHT
from ..home.paths import Home
from ..model.errors import SpecError
from . import preflight_server

PREFLIGHT_TIMEOUT_S = 180.0  # seconds on an idle machine, half a minute on a busy one; past this: a note


class Check:
    """One spec to check: its label (the job file, or a sweep parameter's value) and a sweep's objective."""

    def __init__(self, label: str, spec: dict[str, Any], objective: Optional[str] = None, *, objective_label: str = ""):
        self.label, self.spec, self.objective = label, spec, objective
        self.objective_label = objective_label or label  # the sweep file, where the objective is written

    def as_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "spec": self.spec,
            "objective": self.objective,
            "objective_label": self.objective_label,
        }


def enabled(env: Optional[dict[str, str]] = None) -> bool:
    """ORCH_PREFLIGHT=off skips it (a script submitting many jobs it knows are good)."""
    value = (env if env is not None else os.environ).get(ENV_PREFLIGHT, "").strip().lower()
    return value not in ("off", "0", "no", "false")


def preflight(
    checks: Sequence[Check],
    *,
    note: Callable[[str], None],
    timeout: float = PREFLIGHT_TIMEOUT_S,
    python: Optional[str] = None,
    home: Optional[Home] = None,
) -> None:
    """Raise SpecError with every problem the pre-flight finds in the built-in specs of `checks`;
    command jobs have none to check. `note` gets what it could not check, or why it did not run.
    `python`: the interpreter the job will run with (the daemon's, Home.job_python), so a job is
    checked against the packages it will have; default this process's own. `home`: where the
    daemon's warm pre-flight listens (preflight_server.py), asked first; the subprocess otherwise."""
    builtin = [c for c in checks if "command" not in c.spec]
    if not builtin or not enabled():
        return
    request = {"checks": [c.as_json() for c in builtin]}
    # A job with its own [env] (HF_HOME: where its models are cached) is checked in that
    # environment, which the warm server (started with the daemon's) does not have.
    if home is not None and not any(c.spec.get("env") for c in builtin):
        answer = preflight_server.ask(home, request, python or sys.executable, timeout)
        if answer is not None:
            _report(answer, note)
            return
        if not preflight_server.socket_path(home).exists():
            # none yet: the daemon starts one on this word, for the next submits (never for a
            # daemon that only ever runs command jobs, nor at every start of a test daemon)
            from ..home.wake import WARM_PREFLIGHT, poke

            poke(home.wake_socket, WARM_PREFLIGHT)
    # The job's [env] (HF_HOME: where its models are cached), and never a download: what is not
    # on this machine yet is fetched, and checked, when the job runs.
    env = {**os.environ, **(builtin[0].spec.get("env") or {}), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    try:
        own = python is None or python == sys.executable
        done = subprocess.run(
            [python or sys.executable, "-m", "training.preflight"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            # where this `training` is; another interpreter finds its own install's
            cwd=str(Path(__file__).resolve().parents[2]) if own else None,
        )
    except subprocess.TimeoutExpired:
        note(f"note: the pre-flight took over {timeout:.0f} s and was stopped; the job is checked when it runs")
        return
    except OSError as exc:
        note(f"note: the pre-flight could not start ({exc}); the job is checked when it runs")
        return
    answer = _answer(done.stdout)
    if done.returncode != 0 or answer is None:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        where = "" if python is None or python == sys.executable else f" in {python}, the daemon's Python"
        note(f"note: the pre-flight failed{where} ({last[0][:200]}); the job is checked when it runs")
        return
    _report(answer, note)


def _report(answer: dict[str, Any], note: Callable[[str], None]) -> None:
    for line in answer.get("notes") or []:
        note(f"note: {line}")
    if answer.get("problems"):
        raise SpecError(list(answer["problems"]))


def _answer(stdout: str) -> Optional[dict[str, Any]]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
