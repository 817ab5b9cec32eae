"""job.toml `pass_env` (names a job takes from the daemon's environment) and `secret_env` (names that
reach a cluster job only through its secret file), as users meet them: a bad list is one line
naming the file and the field, exit 2, nothing queued; a good one is kept on the job. And a secret
in config.toml's `[ray] runtime_env`, which Ray would serve from its dashboard, is refused without
its value. Half the table through the real `orch` console script, half through the in-process CLI."""

from __future__ import annotations

import json

import pytest

COMMAND = 'gpus = 0\ncommand = ["python", "train.py"]\n'

CASES = [
    ("not_a_list", COMMAND + 'pass_env = "HF_TOKEN"\n', "pass_env: must be a list (got 'HF_TOKEN')"),
    (
        "bad_name",
        COMMAND + 'pass_env = ["HF-TOKEN"]\n',
        "pass_env: 'HF-TOKEN' is not a valid environment variable name",
    ),
    ("twice", COMMAND + 'pass_env = ["HF_TOKEN", "HF_HOME", "HF_TOKEN"]\n', "pass_env: HF_TOKEN is listed twice"),
    (
        "orchs_own",
        COMMAND + 'pass_env = ["ORCH_JOB_ID"]\n',
        "pass_env: ORCH_JOB_ID is set by orch for each attempt; it cannot be taken from the daemon's environment",
    ),
    (
        "gpus_are_orchs",
        COMMAND + 'pass_env = ["CUDA_VISIBLE_DEVICES"]\n',
        "pass_env: CUDA_VISIBLE_DEVICES is set by orch for each attempt; it cannot be taken from the daemon's "
        "environment",
    ),
    (
        "also_in_env",
        COMMAND + 'pass_env = ["HF_TOKEN"]\n[env]\nHF_TOKEN = "hf_x"\n',
        "pass_env: HF_TOKEN is also set in [env]; keep one (pass_env takes the daemon's value)",
    ),
    (
        "secret_env_unknown",
        COMMAND + 'secret_env = ["DB_URL"]\n',
        "secret_env: DB_URL is neither in [env] nor in pass_env; list only the job's own variables",
    ),
    (
        "secret_env_bad_name",
        COMMAND + 'secret_env = ["db url"]\n',
        "secret_env: 'db url' is not a valid environment variable name",
    ),
]

ROUTED = [
    pytest.param(text, expected, "orch" if i % 2 == 0 else "cli", id=f"{cid}-{'orch' if i % 2 == 0 else 'cli'}")
    for i, (cid, text, expected) in enumerate(CASES)
]


@pytest.mark.parametrize("text, expected, via", ROUTED)
def test_a_bad_pass_env_or_secret_env_is_one_line_exit_2_and_queues_nothing(
    text, expected, via, request, write_file, job_count
):
    runner = request.getfixturevalue(via)
    path = write_file("job.toml", text)
    ran = runner("submit", path).assert_failed(2)
    assert ran.err.strip().splitlines() == [f"{path}: {expected}"], ran.err
    assert ran.out == "" and job_count() == 0


def test_a_good_pass_env_and_secret_env_are_kept_on_the_job(orch, write_file):
    text = COMMAND + 'pass_env = ["HF_TOKEN", "NCCL_SOCKET_IFNAME"]\nsecret_env = ["DB_URL"]\n'
    path = write_file("job.toml", text + '[env]\nDB_URL = "postgres://u:pw@db/x"\n')
    orch("submit", path).assert_ok()
    spec = orch("show", "1", "--json").assert_ok()
    shown = json.loads(spec.out)["spec"]
    assert shown["pass_env"] == ["HF_TOKEN", "NCCL_SOCKET_IFNAME"] and shown["secret_env"] == ["DB_URL"]
    assert "pw@db" not in spec.out  # [env] values stay masked


def test_a_secret_in_the_ray_runtime_env_is_refused_without_its_value(orch, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[ray]\naddress = "http://10.0.0.5:8265"\nruntime_env = { env_vars = { WANDB_API_KEY = "wk-1234567" } }\n'
    )
    ran = orch("config", "check", path).assert_failed(2)
    assert "ray.runtime_env: env_vars.WANDB_API_KEY: Ray's dashboard shows every job's runtime_env" in ran.err, ran.err
    assert 'pass_env = ["WANDB_API_KEY"]' in ran.err and "wk-1234567" not in ran.err + ran.out
