"""`orch cancel` and `orch retry` as users drive them (real console script and CliRunner): what
changes at once, what is only requested of the daemon, and exit 1 for a request that cannot be
done (a finished job, an unknown id)."""

from __future__ import annotations

import pytest

from orchestrator.model.states import JobState
from test_cli import NO_DAEMON, status_json, submitted_id, walk


# -- cancel / retry ---------------------------------------------------------------------------


def test_cancel_a_queued_job_is_immediate(orch, good_job, store):
    job_id = submitted_id(orch("submit", good_job, "--json"))

    ran = orch("cancel", job_id).assert_ok()

    assert ran.out.strip() == f"cancelled job {job_id} (tiny)"
    job = store.get(job_id)
    assert job.state is JobState.CANCELLED and job.finished_at is not None
    assert [e.kind for e in store.events(job_id)] == ["submitted", "cancelled"]


def test_cancel_a_running_job_records_the_request_for_the_daemon(cli, good_job, store):
    job_id = submitted_id(cli("submit", good_job, "--json"))
    walk(store, job_id, JobState.RUNNING)

    ran = cli("cancel", job_id).assert_ok()

    assert ran.out.startswith(f"cancelling job {job_id} (tiny): SIGTERM now")
    assert NO_DAEMON in ran.err
    job = store.get(job_id)
    assert job.state is JobState.RUNNING and job.cancel_requested_at is not None
    assert store.events(job_id)[-1].kind == "cancel_requested"


@pytest.mark.parametrize("final", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
def test_cancel_a_finished_job_fails_with_exit_1(orch, cli, good_job, store, final):
    job_id = submitted_id(cli("submit", good_job, "--json"))
    walk(store, job_id, *([JobState.CANCELLED] if final is JobState.CANCELLED else [JobState.RUNNING, final]))
    events = store.events(job_id)

    ran = orch("cancel", job_id).assert_failed(1)

    assert f"job {job_id} is {final.value}; it cannot become cancelled" in ran.err
    assert store.get(job_id).state is final and store.events(job_id) == events


def test_retry_a_cancelled_job_requeues_it_without_resetting_the_attempt(orch, cli, good_job, store):
    job_id = submitted_id(cli("submit", good_job, "--json"))
    walk(store, job_id, JobState.RUNNING, JobState.QUEUED, JobState.RUNNING, JobState.CANCELLED)

    ran = orch("retry", job_id).assert_ok()

    assert ran.out.startswith(f"job {job_id} (tiny) queued again")
    job = store.get(job_id)
    assert job.state is JobState.QUEUED and job.attempt == 2 and job.finished_at is None
    (row,) = status_json(cli)
    assert (row["id"], row["state"], row["attempt"]) == (job_id, "queued", 2)
    assert store.events(job_id)[-1].kind == "retrying"


def test_retry_with_a_budget_sets_max_cost(cli, good_job, store):
    job_id = submitted_id(cli("submit", good_job, "--json"))
    walk(store, job_id, JobState.RUNNING, JobState.STOPPED)
    cli("retry", job_id, "--budget", "12.5").assert_ok()
    assert store.get(job_id).max_cost == 12.5 and store.get(job_id).state is JobState.QUEUED


def test_retry_an_active_or_succeeded_job_fails_with_exit_1(cli, good_job, store):
    queued = submitted_id(cli("submit", good_job, "--json"))
    done = submitted_id(cli("submit", good_job, "--json"))
    walk(store, done, JobState.RUNNING, JobState.SUCCEEDED)

    assert "it is still active" in cli("retry", queued).assert_failed(1).err
    assert "it already succeeded" in cli("retry", done).assert_failed(1).err
    assert store.get(done).state is JobState.SUCCEEDED


@pytest.mark.parametrize(
    "args", [["show", "4242"], ["cancel", "4242"], ["retry", "4242"], ["logs", "4242"], ["show", "4242", "--json"]]
)
def test_an_unknown_job_id_is_exit_1_with_a_message(orch, cli, args, store):
    # the console script for two of them, CliRunner for the rest
    runner = orch if args[0] in ("show", "cancel") else cli
    ran = runner(*args).assert_failed(1)
    assert ran.err.strip() == "orch: no job 4242 (see `orch status --all`)"
    assert ran.out == ""


def test_a_job_id_that_is_not_a_number_is_a_usage_error(orch):
    ran = orch("show", "seven").assert_failed(2)
    assert "Usage: orch show" in ran.err and "job_id" in ran.err.lower()


# -- retry --gpus ----------------------------------------------------------------------------------

BUILTIN_SPEC = {
    "name": "sft",
    "gpus": 2,
    "model": {"name_or_path": "/models/tiny", "task": "causal-lm"},
    "data": {"train": "/data/train.jsonl"},
    "train": {"batch_size": 8, "accumulate_grad_batches": 3, "strategy": "fsdp"},
}


def test_retry_on_another_gpu_count_keeps_the_effective_batch_or_refuses_in_one_line(cli, store, home):
    import tomllib

    job_id = store.submit(
        name="sft", kind="builtin", gpus=2, priority=0, retries=0, spec=BUILTIN_SPEC, spec_path="", now=1.0
    ).id
    walk(store, job_id, JobState.RUNNING, JobState.FAILED)
    (home / "config.toml").write_text("[daemon]\ngpus = [0, 1, 2, 3]\n")  # --gpus is checked against these

    # 8 x 3 x 2 = 48 samples per step: 4 GPUs would need accumulate 1.5
    ran = cli("retry", job_id, "--gpus", "4").assert_failed(2)
    assert len(ran.err.strip().splitlines()) == 1 and "cannot keep it" in ran.err and "48" in ran.err
    assert store.get(job_id).state is JobState.FAILED and store.get(job_id).gpus == 2

    cli("retry", job_id, "--gpus", "1").assert_ok()
    job = store.get(job_id)
    assert job.state is JobState.QUEUED and job.gpus == 1
    assert job.spec["gpus"] == 1 and job.spec["train"]["accumulate_grad_batches"] == 6
    written = tomllib.loads((home / "runs" / str(job_id) / "job.toml").read_text())
    assert written["gpus"] == 1 and written["train"]["accumulate_grad_batches"] == 6
    assert "on 1 GPU(s) (was 2)" in store.events(job_id)[-1].detail
    # `orch show` says what each rank holds, before and after
    assert "ranks:     fsdp: each of 2 ranks holds 1/2" not in cli("show", job_id).out  # one GPU now
    two = store.submit(
        name="sft2", kind="builtin", gpus=2, priority=0, retries=0, spec=BUILTIN_SPEC, spec_path="", now=2.0
    )
    assert "ranks:     fsdp: each of 2 ranks holds 1/2 of the parameters" in cli("show", two.id).out
