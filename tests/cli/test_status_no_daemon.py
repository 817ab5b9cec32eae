"""`orch status` with no daemon running: a queued job does not wait for "a free CPU slot" (none is
coming); its reason says that no daemon runs the queue and how to start one, in the table, in
`--json` and in `orch show`."""

from __future__ import annotations

import json


def test_a_queued_job_with_no_daemon_says_the_daemon_is_not_running_and_how_to_start_it(orch, write_file):
    job = write_file("cpu.toml", 'name = "cpu"\ngpus = 0\ncommand = ["true"]\n')
    job_id = json.loads(orch("submit", job, "--json").assert_ok().out)["id"]
    [row] = json.loads(orch("status", "--json").assert_ok().out)
    assert "free CPU slot" not in row["reason"]
    assert "no daemon is running" in row["reason"] and "`orch daemon start`" in row["reason"]
    table = orch("status").assert_ok().out
    assert "free CPU slot" not in table and "no daemon is running" in table
    shown = json.loads(orch("show", job_id, "--json").assert_ok().out)
    assert "no daemon is running" in shown["reason"]
