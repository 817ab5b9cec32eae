"""`orch` as users and scripts drive it, through the real console script (subprocess) and through
typer's CliRunner: the documented commands, options, exit codes, JSON keys, and hints on stderr only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from orchestrator.model.records import AttemptEnd, AttemptStart
from orchestrator.model.states import AttemptOutcome, EventKind, JobState

STATUS_KEYS = {"id", "name", "state", "attempt", "gpus", "step", "total_steps", "eta_s", "runtime_s", "cost"}
NO_DAEMON = "no daemon is running"


def submitted_id(ran) -> int:
    ran.assert_ok()
    return json.loads(ran.out)["id"]


def status_json(runner, *args) -> list[dict]:
    ran = runner("status", "--json", *args).assert_ok()
    return json.loads(ran.out)


def walk(store, job_id: int, *states: JobState, now: float = 1000.0):
    """Drive a job through the store the way the daemon would (starting an attempt per run)."""
    job = store.get(job_id)
    for state in states:
        now += 10
        if state is JobState.RUNNING:
            n = job.attempt + 1
            job = store.transition(
                job_id,
                state,
                EventKind.STARTED,
                now,
                updates={"attempt": n, "started_at": now},
                begin_attempt=AttemptStart(n),
            )
        elif job.state is JobState.RUNNING:
            kind = {JobState.QUEUED: EventKind.PREEMPTED, JobState.MOVED: EventKind.LEASE_LOST}.get(state)
            kind = kind or EventKind(state.value)
            job = store.transition(
                job_id,
                state,
                kind,
                now,
                end_attempt=AttemptEnd(
                    now,
                    AttemptOutcome.PREEMPTED if state is JobState.QUEUED else AttemptOutcome(state.value),
                    exit_code=0 if state is JobState.SUCCEEDED else 1,
                ),
            )
        else:
            job = store.transition(job_id, state, EventKind(state.value), now)
    return job


# -- submit -----------------------------------------------------------------------------------


def test_submit_json_parses_while_the_no_daemon_hint_goes_to_stderr(orch, good_job, store):
    ran = orch("submit", good_job, "--json").assert_ok()

    data = json.loads(ran.out)  # stdout is only the JSON, even with no daemon running
    assert set(data) >= {"id", "name", "state"}
    assert data["name"] == "tiny" and data["state"] == "queued"
    assert store.get(data["id"]).state is JobState.QUEUED
    hint = ran.err.strip().splitlines()
    assert len(hint) == 1 and NO_DAEMON in hint[0]


def test_submit_without_json_says_which_job(orch, good_job, store):
    ran = orch("submit", good_job).assert_ok()
    (job,) = store.jobs()
    assert ran.out.strip() == f"submitted job {job.id} (tiny)"
    assert NO_DAEMON in ran.err and len(ran.err.strip().splitlines()) == 1
    assert (store.path.parent / "runs" / str(job.id) / "job.toml").is_file()


def test_submit_priority_overrides_the_file(cli, good_job, store):
    job_id = submitted_id(cli("submit", good_job, "--priority", "7", "--json"))
    assert store.get(job_id).priority == 7
    (row,) = status_json(cli)
    assert row["priority"] == 7


def test_submit_after_waits_for_the_dependency(cli, good_job, store, job_count):
    first = submitted_id(cli("submit", good_job, "--json"))
    second = submitted_id(cli("submit", good_job, "--after", first, "--json"))

    assert store.get(second).after_ids == [first]
    rows = {r["id"]: r for r in status_json(cli)}
    assert rows[second]["state"] == "queued"
    assert rows[second]["reason"] == f"waiting for job {first} to succeed"

    ran = cli("submit", good_job, "--after", 999).assert_failed(1)
    assert "no job 999" in ran.err
    assert job_count() == 2


def test_submit_at_a_delay_holds_the_job(cli, good_job, store):
    before = time.time()
    job_id = submitted_id(cli("submit", good_job, "--at", "+30m", "--json"))
    after = time.time()

    not_before = store.get(job_id).not_before
    assert before + 1800 <= not_before <= after + 1800
    (row,) = status_json(cli)
    assert row["state"] == "queued" and row["reason"].startswith("held until ")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("2030-01-02T03:04", datetime(2030, 1, 2, 3, 4).timestamp()),  # local time
        ("2030-01-02T03:04+08:00", datetime(2030, 1, 1, 19, 4, tzinfo=timezone.utc).timestamp()),
        ("+2h", None),
    ],
)
def test_submit_at_iso_or_delay(orch, good_job, store, value, expected):
    before = time.time()
    job_id = submitted_id(orch("submit", good_job, "--at", value, "--json"))
    got = store.get(job_id).not_before
    if expected is None:
        assert before + 7200 <= got <= time.time() + 7200
    else:
        assert got == pytest.approx(expected)


@pytest.mark.parametrize("value", ["tomorrow", "+30", "30m", "2030-13-01T00:00", "+-5m"])
def test_submit_at_rejects_what_it_cannot_read(cli, good_job, job_count, value):
    ran = cli("submit", good_job, "--at", value).assert_failed(2)
    assert ran.err.startswith(f"--at: cannot read {value!r}")
    assert job_count() == 0


def test_submit_works_with_no_daemon_and_says_so_once(orch, good_job, job_count):
    ran = orch("submit", good_job).assert_ok()
    assert [line for line in ran.err.splitlines() if line.strip()] == [
        "note: no daemon is running; start one with `orch daemon start` (or run it now with `orch run`)"
    ]
    assert job_count() == 1


# -- status -----------------------------------------------------------------------------------


@pytest.fixture
def six_jobs(cli, good_job, store):
    """One job in each state users see; returns {state: job id}."""
    ids = {}
    for state in JobState:
        job_id = submitted_id(cli("submit", good_job, "--json"))
        path = {
            JobState.QUEUED: [],
            JobState.RUNNING: [JobState.RUNNING],
            JobState.SUCCEEDED: [JobState.RUNNING, JobState.SUCCEEDED],
            JobState.FAILED: [JobState.RUNNING, JobState.FAILED],
            JobState.CANCELLED: [JobState.CANCELLED],
            JobState.STOPPED: [JobState.RUNNING, JobState.STOPPED],
            JobState.PRUNED: [JobState.RUNNING, JobState.PRUNED],
            JobState.MOVED: [JobState.RUNNING, JobState.MOVED],
        }[state]
        walk(store, job_id, *path)
        ids[state] = job_id
    return ids


def test_status_json_has_specs_keys_and_only_active_jobs(cli, six_jobs):
    rows = status_json(cli)

    assert {r["id"] for r in rows} == {six_jobs[JobState.QUEUED], six_jobs[JobState.RUNNING]}
    for row in rows:
        assert STATUS_KEYS <= set(row)
        assert row["gpus"] == 0 and row["attempt"] >= 1 and row["name"] == "tiny"
    assert {r["state"] for r in rows} == {"queued", "running"}


def test_status_all_json_lists_every_job(orch, six_jobs):
    rows = status_json(orch, "--all")
    assert {r["id"]: r["state"] for r in rows} == {job_id: state.value for state, job_id in six_jobs.items()}
    assert all(STATUS_KEYS <= set(r) for r in rows)
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)


def test_status_shows_progress_and_eta_of_a_running_job(cli, good_job, store, home):
    job_id = submitted_id(cli("submit", good_job, "--json"))
    job = walk(store, job_id, JobState.RUNNING)
    started = store.attempts(job_id)[-1].started_at
    (home / "runs" / str(job_id) / "progress.json").write_text(
        json.dumps(
            {
                "step": 50,
                "total_steps": 200,
                "epoch": 0,
                "metrics": {},
                "samples_per_s": 3.0,
                "updated_at": started + 100,
            }
        )
    )

    (row,) = status_json(cli)

    assert (row["state"], row["step"], row["total_steps"], row["attempt"]) == ("running", 50, 200, job.attempt)
    assert row["eta_s"] == pytest.approx(300.0)  # 150 steps left at 2 s a step


def test_status_table_for_people(orch, six_jobs):
    ran = orch("status").assert_ok()
    lines = ran.out.strip().splitlines()
    header = lines[0].split()
    assert header[:5] == ["ID", "NAME", "STATE", "ATT", "GPUS"]
    assert {"PROGRESS", "ETA", "RUNTIME", "COST"} <= set(header)
    states = {int(line.split()[0]): line.split()[2] for line in lines[1:]}
    assert states == {six_jobs[JobState.QUEUED]: "queued", six_jobs[JobState.RUNNING]: "running"}
    attempts = {int(line.split()[0]): line.split()[3] for line in lines[1:]}
    # a job never started has no attempt yet (it used to read 1, as if it had run once)
    assert attempts == {six_jobs[JobState.QUEUED]: "-", six_jobs[JobState.RUNNING]: "1"}, ran.out
    assert "\x1b[" not in ran.out  # no color codes when piped
    assert NO_DAEMON in ran.err

    everything = orch("status", "--all").assert_ok()
    assert len(everything.out.strip().splitlines()) == 1 + len(six_jobs)


def test_status_with_no_jobs(cli):
    assert status_json(cli) == []
    assert status_json(cli, "--all") == []
    ran = cli("status").assert_ok()
    assert ran.out.startswith("no jobs queued or running")


# -- show -------------------------------------------------------------------------------------


def test_show_json_has_spec_events_attempts_checkpoints_result(orch, good_job, store, home):
    job_id = submitted_id(orch("submit", good_job, "--json"))
    walk(store, job_id, JobState.RUNNING, JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED)
    run_dir = home / "runs" / str(job_id)
    (run_dir / "checkpoints").mkdir()
    for name in ("step-00000100.ckpt", "step-00000020.ckpt", "best.ckpt"):
        (run_dir / "checkpoints" / name).write_bytes(b"x" * 10)
    result = {
        "metrics": {"val_acc": 0.91},
        "best_metric": {"val_acc": 0.91},
        "best_checkpoint": "best.ckpt",
        "steps": 100,
        "epochs": 1,
        "early_stopped": False,
        "batch_size": 32,
    }
    (run_dir / "result.json").write_text(json.dumps(result))

    data = json.loads(orch("show", job_id, "--json").assert_ok().out)

    assert STATUS_KEYS <= set(data) and {"spec", "events", "attempts", "checkpoints", "result"} <= set(data)
    assert data["state"] == "succeeded" and data["attempt"] == 2
    assert data["spec"]["command"] == ["python", "-c", "print('hi')"] and data["spec"]["name"] == "tiny"
    assert [e["kind"] for e in data["events"]] == ["submitted", "started", "preempted", "started", "succeeded"]
    assert all(set(e) >= {"at", "kind", "detail"} for e in data["events"])
    assert data["events"][0]["detail"] == f"from {good_job}"
    assert [a["n"] for a in data["attempts"]] == [1, 2]
    assert [a["outcome"] for a in data["attempts"]] == ["preempted", "succeeded"]
    assert [c["step"] for c in data["checkpoints"]] == [20, 100, None]  # by step; best last
    assert data["result"] == result


def test_show_text_for_people(cli, good_job):
    job_id = submitted_id(cli("submit", good_job, "--json"))
    ran = cli("show", job_id).assert_ok()
    assert ran.out.startswith(f"job {job_id}  tiny  [queued]")
    assert "git:       not a git checkout" in ran.out
    assert "submitted" in ran.out


def test_show_records_git_commit_and_dirty_flag(orch, tmp_path, store):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], check=True)
    (repo / "train.py").write_text("print('v1')\n")
    (repo / "job.toml").write_text('name = "gitjob"\ngpus = 0\ncommand = ["python", "train.py"]\n')
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "v1"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    clean = submitted_id(orch("submit", repo / "job.toml", "--json"))
    (repo / "train.py").write_text("print('v2, uncommitted')\n")
    dirty = submitted_id(orch("submit", repo / "job.toml", "--json"))

    assert json.loads(orch("show", clean, "--json").out)["git"] == {"commit": head, "dirty": False}
    assert json.loads(orch("show", dirty, "--json").out)["git"] == {"commit": head, "dirty": True}
    text = orch("show", dirty).assert_ok().out
    assert f"git:       {head[:12]} (dirty tree)" in text


# -- logs -------------------------------------------------------------------------------------


def test_logs_all_attempts_in_order_and_the_last_n_lines(cli, orch, good_job, store, home):
    job_id = submitted_id(cli("submit", good_job, "--json"))
    walk(store, job_id, JobState.RUNNING, JobState.QUEUED, JobState.RUNNING)
    run_dir = home / "runs" / str(job_id)
    (run_dir / "attempt-1.log").write_text("one\ntwo\nthree\n")
    (run_dir / "attempt-2.log").write_text("four\nfive\n")

    assert orch("logs", job_id).assert_ok().out == "one\ntwo\nthree\nfour\nfive\n"
    assert orch("logs", job_id, "-n", 3).assert_ok().out == "three\nfour\nfive\n"
    assert cli("logs", job_id, "-n", 1).assert_ok().out == "five\n"


def test_logs_of_a_job_that_has_not_run_says_so_on_stderr(cli, good_job):
    job_id = submitted_id(cli("submit", good_job, "--json"))
    ran = cli("logs", job_id).assert_ok()
    assert ran.out == "" and "has no log yet: it is queued" in ran.err


# -- where state lives ------------------------------------------------------------------------


def test_home_flag_wins_over_orch_home(orch, good_job, tmp_path, home, job_count):
    other = tmp_path / "other-home"

    job_id = submitted_id(orch("--home", other, "submit", good_job, "--json"))

    assert job_count() == 0  # nothing under $ORCH_HOME
    assert (other / "orch.db").is_file() and (other / "runs" / str(job_id) / "job.toml").is_file()
    rows = json.loads(orch("--home", other, "status", "--json").assert_ok().out)
    assert [r["id"] for r in rows] == [job_id]
    assert status_json(orch) == []


def test_orch_home_env_is_used_when_no_flag(orch, good_job, tmp_path):
    elsewhere = tmp_path / "env-home"
    orch("submit", good_job, env={"ORCH_HOME": str(elsewhere)}).assert_ok()
    assert (elsewhere / "orch.db").is_file()


def test_help_is_useful(orch):
    top = orch("--help").assert_ok().out
    for command in ("submit", "run", "status", "show", "logs", "cancel", "retry", "cost", "daemon", "notify", "config"):
        assert command in top
    sub = orch("submit", "--help").assert_ok().out
    assert "--priority" in sub and "--after" in sub and "--at" in sub and "--json" in sub


# -- the CLI stays light ----------------------------------------------------------------------

HEAVY = ("torch", "lightning", "pytorch_lightning", "transformers", "datasets", "optuna", "peft")
PROBE = """
import json, os, sys
import orchestrator.cli.app, orchestrator.daemon.runtime, orchestrator.daemon.tick, notifiers
from orchestrator.cli.app import main
for argv in (["submit", sys.argv[1], "--json"], ["status", "--json"], ["status", "--all"], ["show", "1", "--json"]):
    sys.argv = ["orch", *argv]
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, (argv, exc.code)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in %r)
sys.stderr.write("HEAVY=" + json.dumps(heavy) + "\\n")
""" % (HEAVY,)


def test_daemon_and_cli_never_import_the_training_stack(home, good_job):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(home)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(good_job)], capture_output=True, text=True, env=env, timeout=120
    )

    assert proc.returncode == 0, proc.stderr
    (marker,) = [line for line in proc.stderr.splitlines() if line.startswith("HEAVY=")]
    assert json.loads(marker[len("HEAVY=") :]) == []
