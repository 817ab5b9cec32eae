"""Inputs a demanding new user tried on the knobs with the least outside use (the trial of issue
44's session): each is refused with exit 2, one line naming the file and the field, nothing queued,
or accepted where the user meant something plain (a job file saved with a byte-order mark, in a
folder whose name has spaces and non-ASCII letters)."""

from __future__ import annotations

import json

import pytest

from orchestrator.model.errors import ConfigError
from orchestrator.spec.config import load_config

COMMAND = """\
gpus = 0
command = ["python", "train.py"]
"""
BUILTIN = """\
gpus = 0
[model]
name_or_path = "bert-base-uncased"
[data]
train = "imdb"
"""

# (case id, job.toml text, the problem line after "<file>: ")
JOB_CASES = [
    # pydantic read 1, 0, "yes" and "off" as booleans: cpu_offload = 1 turned offloading on unasked
    (
        "cpu_offload_one",
        BUILTIN + '[train]\nstrategy = "fsdp"\ncpu_offload = 1\n',
        "train.cpu_offload: must be true or false (got 1)",
    ),
    (
        "deterministic_yes",
        BUILTIN + '[train]\ndeterministic = "yes"\n',
        "train.deterministic: must be true or false (got 'yes')",
    ),
    (
        "background_zero",
        COMMAND + "[checkpoint]\nbackground = 0\n",
        "checkpoint.background: must be true or false (got 0)",
    ),
    # a TOML time of day: pydantic's union said it twice, once as 'deadline.datetime'
    (
        "deadline_a_time_of_day",
        COMMAND + "deadline = 10:00:00\n",
        "deadline: must be a date and time with its zone, e.g. 2026-12-05T18:00+08:00 (got 10:00:00)",
    ),
    # set by orch after [env] for every attempt: the value would silently never reach the job
    (
        "env_cuda_visible_devices",
        COMMAND + '[env]\nCUDA_VISIBLE_DEVICES = "3"\n',
        "env.CUDA_VISIBLE_DEVICES: orch sets it to the GPUs it gives each attempt: ask with gpus = N (and choose "
        "the machine's GPUs with config.toml [daemon] gpus); remove it",
    ),
    (
        "env_orch_job_id",
        COMMAND + '[env]\nORCH_JOB_ID = "7"\n',
        "env.ORCH_JOB_ID: orch sets it for every attempt, so the job would never see this value: remove it",
    ),
    (
        "cpu_offload_with_ddp",
        BUILTIN + "[train]\ncpu_offload = true\n",
        "train.cpu_offload: offloads FSDP shards; it needs strategy = \"fsdp\" (strategy is 'ddp')",
    ),
]


@pytest.mark.parametrize("text, expected", [pytest.param(t, e, id=c) for c, t, e in JOB_CASES])
def test_a_trial_job_file_is_refused_naming_the_field(text, expected, cli, write_file, job_count):
    path = write_file("job.toml", text)

    ran = cli("submit", path).assert_failed(2)

    assert f"{path}: {expected}" in ran.err.splitlines(), ran.err
    assert job_count() == 0


def test_a_job_file_saved_with_a_byte_order_mark_is_read(cli, tmp_path, job_count):
    path = tmp_path / "job.toml"
    path.write_bytes(b"\xef\xbb\xbf" + b'name = "bom"\ngpus = 0\ncommand = ["python", "-c", "pass"]\n')

    cli("submit", path).assert_ok()

    assert job_count() == 1


def test_a_job_file_that_is_not_utf8_says_so_in_one_line(cli, tmp_path, job_count):
    path = tmp_path / "job.toml"
    path.write_bytes(b'name = "caf\xe9"\ngpus = 0\ncommand = ["true"]\n')

    ran = cli("submit", path).assert_failed(2)

    assert ran.err.strip() == f"{path}: not UTF-8 text (byte 0xe9 at offset 11): save it as UTF-8"
    assert job_count() == 0


def test_a_job_in_a_folder_with_spaces_and_unicode_runs_from_there(orch, tmp_path, job_count):
    folder = tmp_path / "my runs" / "实验 ü"
    folder.mkdir(parents=True)
    path = folder / "job.toml"
    path.write_text('gpus = 0\ncommand = ["python", "-c", "print(1)"]\n', encoding="utf-8")

    ran = orch("submit", "--json", path).assert_ok()
    shown = json.loads(orch("show", "--json", "1").assert_ok().out)

    assert json.loads(ran.out)["id"] == 1
    assert shown["spec"]["workdir"] == str(folder)  # resolved, as it is
    assert job_count() == 1


# (case id, config.toml text, the problem line after "<file>: ")
CONFIG_CASES = [
    (
        "zone_name_with_space",
        '[recovery]\nlaunch = ["true"]\n[[recovery.zones]]\nname = "us east"\n',
        "recovery.zones[0].name: letters, digits, '.', '_' and '-' only, starting with a letter or digit "
        "(got 'us east')",
    ),
    (
        "zone_key_typo",
        '[recovery]\nlaunch = ["true"]\n[[recovery.zones]]\nname = "a"\nprices = 1\n',
        "unknown key 'recovery.zones[0].prices' (did you mean 'recovery.zones[0].spot_price'?)",
    ),
    (
        "zone_aws_keys_under_the_command_provider",
        '[recovery]\nlaunch = ["true"]\n[[recovery.zones]]\nname = "a"\nsubnet = "subnet-1"\n',
        "recovery.zones: zone 'a' sets subnet, which only provider = \"aws\" uses; the command provider is given "
        "the zone's name in ORCH_RECOVERY_ZONE: remove them",
    ),
    (
        "alive_under_the_aws_provider",
        '[recovery]\nprovider = "aws"\nalive = ["bash", "alive.sh"]\n[recovery.aws]\nlaunch_template = "t"\n',
        'recovery.alive: only for provider = "command" (the aws provider never runs it): remove it',
    ),
    ("orchs_own_path_field", 'path = "/etc"\n', "unknown key 'path'"),
    (
        "previous_signing_key_alone",
        '[storage]\nsigning_previous_key_env = "OLD_KEY"\n',
        "storage.signing_previous_key_env: a key being rotated out is accepted only beside signing_key_env, "
        "the key that signs: set both",
    ),
    (
        "previous_signing_key_is_the_current_one",
        '[storage]\nsigning_key_env = "K"\nsigning_previous_key_env = "K"\n',
        "storage.signing_previous_key_env: names K, as signing_key_env does: the previous key is another variable",
    ),
]


@pytest.mark.parametrize("text, expected", [pytest.param(t, e, id=c) for c, t, e in CONFIG_CASES])
def test_a_trial_config_is_refused_naming_the_field(text, expected, cli, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(text)

    ran = cli("config", "check", config).assert_failed(2)

    assert f"{config}: {expected}" in ran.err.splitlines(), ran.err


def test_a_known_keys_hint_never_names_orchs_own_fields(cli, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('signing_key_env = "K"\n')

    ran = cli("config", "check", config).assert_failed(2)

    assert "unknown key 'signing_key_env' (known keys: daemon," in ran.err
    assert "path" not in ran.err.replace(str(config), "")


def test_orch_config_naming_a_missing_file_refuses_submit(cli, good_job, tmp_path, job_count):
    missing = tmp_path / "typo-config.toml"

    ran = cli("submit", good_job, env={"ORCH_CONFIG": str(missing)}).assert_failed(2)

    assert f"{missing}: no such file" in ran.err
    assert job_count() == 0


@pytest.mark.parametrize(
    "zones, problem",
    [
        (
            '[[recovery.zones]]\nname = "a"\non_demand_price = 3.0\nspot_price = 1.0\n[[recovery.zones]]\nname = "b"\n',
            "recovery.zones: zone(s) 'b' set no on_demand_price while others do",
        ),
        (
            '[[recovery.zones]]\nname = "a"\nspot_price = 1.0\n[[recovery.zones]]\nname = "b"\n',
            "recovery.zones: zone(s) 'b' set no spot_price while others do",
        ),
    ],
)
def test_a_zone_without_a_price_beside_priced_ones_is_refused(tmp_path, zones, problem):
    # Unpriced, it would rank as a free zone and win every launch over the priced ones.
    config = tmp_path / "config.toml"
    config.write_text('[recovery]\nlaunch = ["true"]\n' + zones)
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert problem in str(err.value)
    assert str(config) in str(err.value)


def test_zones_all_priced_or_none_priced_load(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[recovery]\nlaunch = ["true"]\n[[recovery.zones]]\nname = "a"\n[[recovery.zones]]\nname = "b"\n')
    assert [z.name for z in load_config(config).recovery.zones] == ["a", "b"]
