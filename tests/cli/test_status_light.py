"""`orch status` stays light (issue 36: 14x a bare Python start on 10,000 jobs, from importing the
config models and `orch run`'s code): with a config.toml and a job recorded running with no
daemon, neither the table nor --json imports pydantic, and the store is asked once for the
running jobs' attempts, not once per job. The CPU-time figure is benchmarks/cli_latency.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.home.paths import Home
from orchestrator.model.records import AttemptStart
from orchestrator.model.states import EventKind, JobState
from orchestrator.store import Store

# `orch ARGS` in-process, then which modules it imported and how many `attempts` queries it made.
PROBE = r"""
import json, sqlite3, sys
queries = []
real_connect = sqlite3.connect
def connect(*a, **k):
    conn = real_connect(*a, **k)
    conn.set_trace_callback(lambda sql: queries.append(sql))
    return conn
sqlite3.connect = connect
sys.argv = ["orch"] + json.loads(sys.argv[1])
from orchestrator.cli import main
try:
    main()
except SystemExit:
    pass
per_attempts = sum(1 for q in queries if "FROM attempts" in q)
sys.stderr.write("\nPROBE=" + json.dumps({"pydantic": "pydantic" in sys.modules, "attempt_queries": per_attempts}) + "\n")
"""


@pytest.fixture
def home_with_running_jobs(tmp_path):
    home = Home(tmp_path / "home").ensure()
    (home.root / "config.toml").write_text('[pricing]\ncurrency = "CNY"\ngpu_hour = 2.0\n')
    store = Store(home.db)
    now = time.time()
    for i in range(5):
        job = store.submit(
            name=f"r{i}", kind="command", gpus=0, priority=0, retries=0, spec={"command": ["x"]}, spec_path="", now=now
        )
        store.transition(
            job.id,
            JobState.RUNNING,
            EventKind.STARTED,
            now,
            updates={"attempt": 1, "started_at": now, "supervisor_pid": 999_999_999},
            begin_attempt=AttemptStart(1),
        )
    store.close()
    return home.root


@pytest.mark.parametrize("args", [["status"], ["status", "--json"]])
def test_orch_status_imports_no_pydantic_and_asks_for_attempts_once(home_with_running_jobs, args):
    env = {**os.environ, "ORCH_HOME": str(home_with_running_jobs)}
    res = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, timeout=60, env=env
    )
    probe = json.loads([line for line in res.stderr.splitlines() if line.startswith("PROBE=")][-1][len("PROBE=") :])
    assert probe == {"pydantic": False, "attempt_queries": 1}, (probe, res.stderr[-2000:])
    if args == ["status"]:
        assert "CNY" in res.stdout  # the currency, read without the config models
        assert "nothing runs it" in res.stderr  # the runnerless note still comes
