"""job.toml validation as users meet it: `orch submit bad.toml` exits 2, names the file and the
exact field in one line per problem, prints no traceback, and queues nothing. Half the table runs
through the real `orch` subprocess, half through typer's CliRunner (same app, in-process)."""

from __future__ import annotations

import pytest

from orchestrator.model.errors import SpecError
from orchestrator.spec.jobspec import load_jobspec

# A built-in job whose model and data are hub ids (nothing local to check) and a command job.
BUILTIN = """\
gpus = 0
[model]
name_or_path = "bert-base-uncased"
[data]
train = "imdb"
"""
COMMAND = """\
gpus = 0
command = ["python", "train.py"]
"""

# (case id, job.toml text, the problem line after "<file>: "). `{dir}` is the job file's folder.
CASES = [
    (
        "deadline_without_zone",
        COMMAND + 'deadline = "2030-12-05T18:00"\n',
        "deadline: 2030-12-05T18:00 has no time zone; write it as 2026-12-05T18:00+08:00 (or Z for UTC)",
    ),
    (
        "deadline_not_a_time",
        COMMAND + 'deadline = "tomorrow"\n',
        "deadline: 'tomorrow' is not a date and time; write it as 2026-12-05T18:00+08:00",
    ),
    ("gpus_bool", COMMAND.replace("gpus = 0", "gpus = true"), "gpus: must be a whole number (got true)"),
    (
        "learning_rate_bool",
        BUILTIN + "[train]\nlearning_rate = true\n",
        "train.learning_rate: must be a number (got true)",
    ),
    ("batch_size_zero", BUILTIN + "[train]\nbatch_size = 0\n", "train.batch_size: must be greater than 0 (got 0)"),
    ("section_typo", COMMAND + "[trian]\nmax_epochs = 3\n", "unknown key 'trian' (did you mean 'train'?)"),
    (
        "key_typo_in_section",
        BUILTIN + "[train]\nlerning_rate = 1e-4\n",
        "unknown key 'train.lerning_rate' (did you mean 'train.learning_rate'?)",
    ),
    ("top_level_typo", COMMAND + "prioriy = 1\n", "unknown key 'prioriy' (did you mean 'priority'?)"),
    ("toml_syntax", 'name = "x"\ngpus = \n', "TOML syntax error: Invalid value (at line 2, column 8)"),
    (
        "missing_train_file",
        BUILTIN.replace('"imdb"', '"data/train.jsonl"'),
        "data.train: no such file or folder '{dir}/data/train.jsonl'",
    ),
    (
        "missing_validation_file",
        BUILTIN + 'validation = "./dev.csv"\n',
        "data.validation: no such file or folder '{dir}/dev.csv'",
    ),
    (
        "missing_local_model",
        BUILTIN.replace('"bert-base-uncased"', '"./models/tiny-bert"'),
        "model.name_or_path: no such local model folder '{dir}/models/tiny-bert'",
    ),
    (
        "command_and_model",
        COMMAND + '[model]\nname_or_path = "bert-base-uncased"\n',
        "'command' cannot be combined with [model]",
    ),
    (
        "neither_command_nor_model",
        "gpus = 0\n",
        "a job needs either `command = [...]` (your own script) or the built-in fine-tune's [model] and [data] "
        "sections; missing [model], [data]",
    ),
    (
        "model_without_data",
        'gpus = 0\n[model]\nname_or_path = "bert-base-uncased"\n',
        "a job needs either `command = [...]` (your own script) or the built-in fine-tune's [model] and [data] "
        "sections; missing [data]",
    ),
    ("bad_env_name", COMMAND + '[env]\nMY-VAR = "x"\n', "env: 'MY-VAR' is not a valid environment variable name"),
    ("env_value_not_string", COMMAND + "[env]\nSEED = 1\n", "env.SEED: must be a string (got 1)"),
    ("negative_gpus", COMMAND.replace("gpus = 0", "gpus = -1"), "gpus: must be at least 0 (got -1)"),
    ("retries_not_a_number", COMMAND + 'retries = "two"\n', "retries: must be a whole number (got 'two')"),
    (
        "precision_unknown",
        BUILTIN + '[train]\nprecision = "8"\n',
        "train.precision: must be one of '32', '16-mixed' or 'bf16-mixed' (got '8')",
    ),
    (
        "learning_rate_zero",
        BUILTIN + "[train]\nlearning_rate = 0.0\n",
        "train.learning_rate: must be greater than 0 (got 0.0)",
    ),
    (
        "warmup_ratio_over_one",
        BUILTIN + "[train]\nwarmup_ratio = 1.5\n",
        "train.warmup_ratio: must be at most 1 (got 1.5)",
    ),
    ("empty_command", "gpus = 0\ncommand = []\n", "command: must not be empty (got [])"),
    (
        "command_is_a_string",
        'gpus = 0\ncommand = "python train.py"\n',
        "command: must be a list (got 'python train.py')",
    ),
    (
        "empty_command_part",
        'gpus = 0\ncommand = ["python", ""]\n',
        "command: no part of the command may be an empty string",
    ),
    ("missing_workdir", COMMAND + 'workdir = "no-such-folder"\n', "workdir: no such folder '{dir}/no-such-folder'"),
    (
        "workdir_on_builtin",
        BUILTIN.replace("gpus = 0\n", 'gpus = 0\nworkdir = "."\n'),
        "'workdir' is only for command jobs",
    ),
    (
        "monitor_unknown",
        BUILTIN + '[early_stopping]\nmonitor = "val_auc"\n',
        "early_stopping.monitor: must be one of 'val_loss', 'val_acc', 'val_f1', 'val_precision', 'val_recall', "
        "'val_perplexity' or 'train_loss' (got 'val_auc')",
    ),
    (
        "val_check_interval_fraction",
        BUILTIN + "[train]\nval_check_interval = 1.5\n",
        "train: val_check_interval: a fraction of an epoch must be in (0, 1]",
    ),
    ("checkpoint_keep_zero", COMMAND + "[checkpoint]\nkeep = 0\n", "checkpoint.keep: must be at least 1 (got 0)"),
    ("budget_negative", COMMAND + "[budget]\nmax_cost = -5\n", "budget.max_cost: must be greater than 0 (got -5)"),
    ("empty_name", COMMAND + 'name = ""\n', "name: must not be empty (got '')"),
    ("model_not_a_table", 'gpus = 0\nmodel = "bert"\n[data]\ntrain = "imdb"\n', "model: must be a table (got 'bert')"),
    ("max_length_text", BUILTIN + 'max_length = "long"\n', "data.max_length: must be a whole number (got 'long')"),
]


# Alternate the two paths so each gets half the table and the suite stays fast.
ROUTED = [
    pytest.param(text, expected, "orch" if i % 2 == 0 else "cli", id=f"{cid}-{'orch' if i % 2 == 0 else 'cli'}")
    for i, (cid, text, expected) in enumerate(CASES)
]


@pytest.mark.parametrize("text, expected, via", ROUTED)
def test_bad_job_file_is_refused_naming_the_field_and_queues_nothing(
    text, expected, via, request, write_file, job_count
):
    runner = request.getfixturevalue(via)  # "orch": the real console script; "cli": CliRunner
    path = write_file("job.toml", text)

    ran = runner("submit", path).assert_failed(2)

    line = f"{path}: {expected.format(dir=path.parent)}"
    assert line in ran.err, f"expected {line!r} in:\n{ran.err}"
    assert ran.out == ""  # nothing that looks like "submitted job N"
    assert job_count() == 0


def test_every_problem_in_a_file_is_reported_at_once(orch, write_file, job_count):
    path = write_file(
        "three.toml",
        """\
        gpus = -1
        retries = -2
        command = ["python", "train.py"]
        [trian]
        max_epochs = 3
        """,
    )

    ran = orch("submit", path).assert_failed(2)

    lines = ran.err.strip().splitlines()
    assert lines == [
        f"{path}: gpus: must be at least 0 (got -1)",
        f"{path}: retries: must be at least 0 (got -2)",
        f"{path}: unknown key 'trian' (did you mean 'train'?)",
    ]
    assert job_count() == 0


def test_a_missing_job_file_is_refused(cli, tmp_path, job_count):
    path = tmp_path / "nowhere" / "job.toml"
    ran = cli("submit", path).assert_failed(2)
    assert f"{path}: no such file" in ran.err
    assert job_count() == 0


def test_a_folder_given_as_job_file_is_refused(cli, tmp_path, job_count):
    ran = cli("submit", tmp_path).assert_failed(2)
    assert f"{tmp_path}: is a folder, not a TOML file" in ran.err
    assert job_count() == 0


def test_paths_resolve_against_the_job_files_folder_not_the_cwd(write_file, tmp_path, monkeypatch):
    path = write_file("job.toml", BUILTIN.replace('"bert-base-uncased"', '"./model"').replace('"imdb"', '"train.csv"'))
    (path.parent / "model").mkdir()
    (path.parent / "train.csv").write_text("text,label\nhi,1\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    spec = load_jobspec(path)

    assert spec.model.name_or_path == str(path.parent / "model")
    assert spec.data.train == str(path.parent / "train.csv")
    assert spec.name == "job"  # the file's stem when no name is given
    assert not spec.is_command


def test_a_hub_id_is_not_checked_on_disk(write_file):
    spec = load_jobspec(write_file("job.toml", BUILTIN))
    assert spec.model.name_or_path == "bert-base-uncased"
    assert spec.data.train == "imdb"


def test_command_job_workdir_defaults_to_the_files_folder(write_file):
    path = write_file("train-job.toml", COMMAND)
    spec = load_jobspec(path)
    assert spec.is_command and spec.workdir == str(path.parent)
    assert spec.name == "train-job"


def test_spec_error_keeps_one_problem_per_line(write_file):
    path = write_file("job.toml", BUILTIN + "[train]\nbatch_size = 0\naccumulate_grad_batches = 0\n")
    with pytest.raises(SpecError) as info:
        load_jobspec(path)
    assert info.value.problems == [
        f"{path}: train.batch_size: must be greater than 0 (got 0)",
        f"{path}: train.accumulate_grad_batches: must be greater than 0 (got 0)",
    ]
    assert str(info.value) == "\n".join(info.value.problems)
    assert info.value.exit_code == 2


def test_resolved_spec_round_trips_through_the_run_folder(write_file, tmp_path):
    from orchestrator.spec.jobspec import load_resolved
    from orchestrator.jobs.lifecycle import write_run_spec
    from orchestrator.home.paths import Home

    spec = load_jobspec(write_file("job.toml", COMMAND + '[env]\nHF_ENDPOINT = "https://hf-mirror.com"\n'))
    written = write_run_spec(Home(tmp_path / "h").ensure(), 1, spec.to_toml_dict())

    again = load_resolved(written)
    assert again == spec
    assert again.env == {"HF_ENDPOINT": "https://hf-mirror.com"}


def test_a_multi_node_job_is_refused_on_the_local_executor_naming_the_fix(tmp_path):
    import subprocess
    import sys

    job = tmp_path / "ddp.toml"
    job.write_text('gpus = 0\nnodes = 2\ncommand = ["python", "-c", "pass"]\n')
    home = tmp_path / "home"
    res = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), "submit", str(job)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{job}: nodes: asks for 2 nodes" in res.stderr and '[executor] kind = "slurm"' in res.stderr
    status = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), "status", "--all", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.stdout.strip() == "[]"  # nothing was queued


def test_max_steps_alone_is_not_capped_by_the_default_epochs(tmp_path):
    # docs/job-toml.md: "set max_epochs or max_steps (or both: the first reached ends training)";
    # the sweeps guide's job sets only max_steps = 2000 and its trials stopped after 3 epochs.
    job = tmp_path / "job.toml"
    job.write_text(BUILTIN + "[train]\nmax_steps = 2000\n")
    spec = load_jobspec(job)
    assert spec.train.max_steps == 2000 and spec.train.max_epochs is None
    job.write_text(BUILTIN + "[train]\nmax_steps = 2000\nmax_epochs = 5\n")
    assert load_jobspec(job).train.max_epochs == 5
    job.write_text(BUILTIN)
    assert load_jobspec(job).train.max_epochs == 3
