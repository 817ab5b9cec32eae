"""A made-up executor for tests/executors/test_executor_registry.py: everything a new kind of executor needs
is this module and one entry in orchestrator/model/executor_kinds.py's table. Its "cluster" runs an
attempt by writing the attempt's exit record at once (code 0) and remembers what it was asked."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional, Sequence

from orchestrator.contract import attempt_exit, attempt_log, read_json, write_exit_record
from orchestrator.home.paths import Home
from orchestrator.model.records import AttemptLaunch, Job

STARTED: list[int] = []  # the job ids it started, in order


class FakeExecutor:
    name = "fake"

    def __init__(self, home: Home):
        self.home = home

    def start(self, launch: AttemptLaunch) -> dict[str, Any]:
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        (launch.run_dir / attempt_log(launch.attempt)).write_text("[fake] ran\n")
        now = time.time()
        write_exit_record(launch.run_dir, launch.attempt, 0, None, now, now)
        STARTED.append(launch.job_id)
        return {"executor_ref": {"fake_id": f"f-{launch.job_id}-{launch.attempt}", "where": "fake: done"}}

    def exchange(self, jobs: Sequence[Job], now: float) -> None:
        pass

    def refresh(self, jobs: Sequence[Job], now: float) -> None:
        pass

    def adopt(self, job: Job) -> Optional[dict[str, Any]]:
        return None

    def alive(self, job: Job) -> bool:
        return self.exit(job) is None

    def exit(self, job: Job) -> Optional[dict[str, Any]]:
        return read_json(self.home.run_dir(job.id) / attempt_exit(job.attempt)) if job.attempt else None

    def terminate(self, job: Job) -> bool:
        return True

    def kill(self, job: Job) -> bool:
        return True

    def clear_lost(self, job: Job) -> None:
        pass

    def dump_stacks(self, job: Job) -> str:
        return "no stack dump on the fake cluster"

    def log_paths(self, job: Job) -> list[Path]:
        return [self.home.run_dir(job.id) / attempt_log(job.attempt)]

    def describe(self, job: Job) -> Optional[str]:
        return (job.executor_ref or {}).get("where")

    def billable(self, job: Job) -> bool:
        return True

    def notice(self, job: Job) -> Optional[str]:
        return None

    def cluster_gpus(self) -> Optional[tuple[float, float]]:
        return None

    def gpu_room(self, now: float) -> Optional[tuple[int, str]]:
        return None


def doctor_check(config: Any, home: Home) -> tuple[str, str, str]:
    return "ok", f"the fake cluster sees {home.runs}", ""
