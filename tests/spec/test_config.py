"""config.toml validation: a bad config refuses `orch submit` (exit 2, the exact field, nothing
queued, no traceback) and `orch config check` says the same; asking for more GPUs than the
config's [daemon] gpus is refused at submit saying how many there are."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.spec.config import load_config
from orchestrator.model.errors import ConfigError

# (case id, config.toml text, the problem line after "<file>: ")
CASES = [
    ("cpu_slots_zero", "[daemon]\ncpu_slots = 0\n", "daemon.cpu_slots: must be at least 1 (got 0)"),
    ("section_typo", "[deamon]\ncpu_slots = 2\n", "unknown key 'deamon' (did you mean 'daemon'?)"),
    ("key_typo", '[pricing]\ncurrancy = "CNY"\n', "unknown key 'pricing.currancy' (did you mean 'pricing.currency'?)"),
    ("negative_gpu_index", "[daemon]\ngpus = [-1]\n", "daemon.gpus: GPU indices must be 0 or more"),
    ("gpus_neither_auto_nor_list", '[daemon]\ngpus = "all"\n', "daemon.gpus: must be one of 'auto' (got 'all')"),
    ("grace_not_a_number", '[daemon]\ngrace_seconds = "25s"\n', "daemon.grace_seconds: must be a number (got '25s')"),
    ("negative_price", "[pricing]\ngpu_hour = -1.5\n", "pricing.gpu_hour: must be at least 0 (got -1.5)"),
    ("budget_zero", "[budget]\ntotal = 0\n", "budget.total: must be greater than 0 (got 0)"),
    (
        "unknown_preemption_source",
        '[preemption]\nsources = ["ibm"]\n',
        "preemption.sources[0]: must be one of 'aws', 'gcp', 'azure' or 'file' (got 'ibm')",
    ),
    (
        "unknown_on_notice",
        '[preemption]\non_notice = "panic"\n',
        "preemption.on_notice: must be one of 'wait' or 'exit' (got 'panic')",
    ),
    (
        "hook_for_unknown_event",
        '[hooks]\non_finish = ["echo", "done"]\n',
        "unknown key 'hooks.on_finish' (hooks are on_<event>",
    ),
    (
        "hook_as_shell_string",
        '[hooks]\non_failed = "echo failed"\n',
        "hooks.on_failed: must be a list of strings, the program and its arguments (got 'echo failed')",
    ),
    ("empty_shutdown_command", "[idle]\nshutdown_command = []\n", "idle.shutdown_command: must not be empty (got [])"),
    ("notifiers_not_tables", 'notifiers = "x"\n', "notifiers: must be an array of tables ([[notifiers]])"),
    (
        "toml_syntax",
        "[daemon]\ncpu_slots = 2\n[pricing\n",
        "TOML syntax error: Expected ']' at the end of a table declaration (at line 3, column 9)",
    ),
]
ROUTED = [
    pytest.param(text, expected, "orch" if i % 2 == 0 else "cli", id=f"{cid}-{'orch' if i % 2 == 0 else 'cli'}")
    for i, (cid, text, expected) in enumerate(CASES)
]


@pytest.mark.parametrize("text, expected, via", ROUTED)
def test_bad_config_refuses_submit_naming_the_field(text, expected, via, request, home, good_job, job_count):
    runner = request.getfixturevalue(via)
    home.mkdir(parents=True)
    config = home / "config.toml"
    config.write_text(text)

    ran = runner("submit", good_job).assert_failed(2)

    assert f"{config}: {expected}" in ran.err, ran.err
    assert job_count() == 0
    assert ran.out == ""


def test_toml_syntax_error_in_config_names_line_and_column(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[daemon]\ncpu_slots = 2 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        f"{path}: TOML syntax error: Expected newline or end of document after a statement (at line 2, column 15)"
    ]


def test_every_problem_in_a_config_is_reported_at_once(cli, home, good_job, job_count):
    home.mkdir(parents=True)
    config = home / "config.toml"
    config.write_text("[daemon]\ncpu_slots = 0\n[pricing]\ngpu_hour = -1\n[hooks]\non_finish = ['x']\n")

    ran = cli("submit", good_job).assert_failed(2)

    lines = ran.err.strip().splitlines()
    assert len(lines) == 3, lines
    assert all(line.startswith(f"{config}: ") for line in lines)
    assert any("daemon.cpu_slots: must be at least 1 (got 0)" in line for line in lines)
    assert any("pricing.gpu_hour: must be at least 0 (got -1)" in line for line in lines)
    assert any("unknown key 'hooks.on_finish'" in line for line in lines)
    assert job_count() == 0


@pytest.mark.parametrize("via", ["orch", "cli"])
def test_more_gpus_than_the_machine_has_is_refused_saying_how_many(via, request, home, write_file, job_count):
    runner = request.getfixturevalue(via)
    home.mkdir(parents=True)
    (home / "config.toml").write_text("[daemon]\ngpus = [0, 1]\n")
    job = write_file("big.toml", 'gpus = 3\ncommand = ["python", "train.py"]\n')

    ran = runner("submit", job).assert_failed(2)

    assert f"{job}: gpus: asks for 3 GPUs but this machine has 2" in ran.err, ran.err
    assert job_count() == 0


def test_as_many_gpus_as_configured_is_accepted(cli, home, write_file, job_count):
    home.mkdir(parents=True)
    (home / "config.toml").write_text("[daemon]\ngpus = [0, 1]\n")
    job = write_file("two.toml", 'gpus = 2\ncommand = ["python", "train.py"]\n')

    cli("submit", job).assert_ok()

    assert job_count() == 1


def test_config_flag_and_env_point_at_another_file(cli, home, good_job, tmp_path, job_count):
    bad = tmp_path / "elsewhere.toml"
    bad.write_text("[daemon]\ncpu_slots = -3\n")

    by_flag = cli("--config", bad, "submit", good_job).assert_failed(2)
    by_env = cli("submit", good_job, env={"ORCH_CONFIG": str(bad)}).assert_failed(2)

    for ran in (by_flag, by_env):
        assert f"{bad}: daemon.cpu_slots: must be at least 1 (got -3)" in ran.err
    assert job_count() == 0


def test_an_explicit_config_that_does_not_exist_is_an_error(cli, good_job, tmp_path, job_count):
    missing = tmp_path / "missing.toml"
    ran = cli("--config", missing, "submit", good_job).assert_failed(2)
    assert f"{missing}: no such file" in ran.err
    assert job_count() == 0


def test_no_config_at_all_gives_the_documented_defaults():
    config = load_config(None)
    assert config.daemon.cpu_slots == 1
    assert config.daemon.gpus == "auto"
    assert config.daemon.grace_seconds == 25
    assert config.pricing.gpu_hour == 0 and config.pricing.currency == ""
    assert config.notifiers == [] and config.preemption.sources == []
    assert config.idle.shutdown_after_minutes is None


def test_a_full_config_from_the_spec_loads(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("""\
[daemon]
cpu_slots = 2
gpus = [0, 1]
grace_seconds = 25

[pricing]
currency = "CNY"
gpu_hour = 1.98
instance_hour = 0.0
spot = true

[budget]
total = 500.0

[preemption]
sources = ["aws", "file"]
poll_seconds = 5
on_notice = "wait"

[idle]
shutdown_after_minutes = 30
shutdown_command = ["shutdown", "-h", "now"]

[hooks]
on_succeeded = ["echo", "ok"]
on_queue_drained = []
""")
    config = load_config(path)
    assert config.daemon.gpus == [0, 1]
    assert config.pricing.currency == "CNY" and config.pricing.gpu_hour == pytest.approx(1.98)
    assert config.preemption.sources == ["aws", "file"]
    assert config.hooks.model_extra["on_succeeded"] == ["echo", "ok"]
    assert "on_failed" not in config.hooks.model_extra
    assert config.path == path


# -- orch config check ------------------------------------------------------------------------


def test_config_check_passes_a_good_file(orch, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[daemon]\ngpus = [0]\n[pricing]\ncurrency = "CNY"\ngpu_hour = 2.0\n')

    ran = orch("config", "check", path).assert_ok()

    assert ran.out.strip() == f"{path}: ok"


def test_config_check_reports_a_bad_file_with_exit_2(orch, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[daemon]\ncpu_slots = 0\n[deamon]\n")

    ran = orch("config", "check", path).assert_failed(2)

    assert ran.err.strip().splitlines() == [
        f"{path}: daemon.cpu_slots: must be at least 1 (got 0)",
        f"{path}: unknown key 'deamon' (did you mean 'daemon'?)",
    ]


def test_config_check_builds_the_notifiers_too(cli, tmp_path):
    # submit does not need the channels' secrets; `config check` must catch a bad channel.
    path = tmp_path / "config.toml"
    path.write_text('[[notifiers]]\ntype = "pigeon"\n')

    ran = cli("config", "check", path).assert_failed(2)

    assert f"{path}: notifiers[0] (pigeon): type: unknown notifier type 'pigeon'" in ran.err


def test_config_check_with_no_config_says_the_defaults_apply(cli, home):
    ran = cli("config", "check").assert_ok()
    assert "the defaults apply" in ran.out
    assert str(Path(home) / "config.toml") in ran.out


def test_config_check_of_a_named_missing_file_fails(cli, tmp_path):
    missing = tmp_path / "nope.toml"
    ran = cli("config", "check", missing).assert_failed(2)
    assert f"{missing}: no such file" in ran.err
