"""Validation at the edge, through the real `orch submit` / `orch config check`: control
characters in a command, env, workdir or any [slurm] field, unusable job names, numbers SQLite
cannot hold or that are not finite, and nesting thousands deep are refused with exit 2, one line
naming the file and the field, no traceback, nothing stored and nothing written outside ORCH_HOME."""

from __future__ import annotations

import json
import sqlite3

import pytest

CMD = 'command = ["python", "-c", "pass"]\ngpus = 0\n'

# (case, job.toml text, the field the message must name)
BAD_JOBS = [
    ("nul in command", 'gpus = 0\ncommand = ["python", "-c", "print(1)\\u0000"]\n', "command[2]"),
    ("newline in env value", CMD + '[env]\nTOKEN = "abc\\ndef"\n', "env.TOKEN"),
    ("escape in env value", CMD + '[env]\nTOKEN = "abc\\u001b[2J"\n', "env.TOKEN"),
    ("control char in workdir", CMD + 'workdir = "/tmp/a\\u0007b"\n', "workdir"),
    ("newline in slurm partition", CMD + '[slurm]\npartition = "gpu\\n#SBATCH --time=99:00:00"\n', "partition"),
    ("newline in slurm time", CMD + '[slurm]\ntime = "1:00:00\\nrm -rf ~"\n', "time"),
    ("newline in slurm extra_args", CMD + '[slurm]\nextra_args = ["--exclusive\\necho pwned"]\n', "extra_args[0]"),
    ("slash in name", 'name = "../../etc"\n' + CMD, "name"),
    ("newline in name", 'name = "a\\nb"\n' + CMD, "name"),
    ("escape sequence in name", 'name = "x\\u001b]0;owned\\u0007"\n' + CMD, "name"),
    ("overlong name", f'name = "{"n" * 300}"\n' + CMD, "name"),
    ("priority past 64 bits", CMD + "priority = 99999999999999999999\n", "priority"),
    ("negative priority past 64 bits", CMD + "priority = -99999999999999999999\n", "priority"),
    ("inf grace seconds", CMD + "grace_seconds = inf\n", "grace_seconds"),
    ("nan watchdog minutes", CMD + "watchdog_minutes = nan\n", "watchdog_minutes"),
    ("inf money", CMD + "[budget]\nmax_cost = inf\n", "budget.max_cost"),
    ("inf hours", CMD + "[budget]\nmax_hours = inf\n", "budget.max_hours"),
    ("deep nesting", CMD + "x = " + "[" * 3000 + "]" * 3000 + "\n", "nested"),
    ("nesting past the limit", CMD + "x = " + "[" * 40 + "]" * 40 + "\n", "nested"),
]


def _jobs(home) -> int:
    db = home / "orch.db"
    if not db.exists():
        return 0
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("case,text,field", BAD_JOBS, ids=[c[0] for c in BAD_JOBS])
def test_submit_refuses_hostile_values(sandbox, case, text, field):
    job = sandbox.root / "job.toml"
    job.write_text(text)
    sandbox.orch("status").clean(0)  # the home exists: what follows must not add a job
    sandbox.mark()
    ran = sandbox.orch("submit", job).clean(2)
    assert str(job) in ran.err and field in ran.err, ran.err
    assert "abc" not in ran.err, "an env value may be a secret: never echoed"
    assert _jobs(sandbox.home) == 0
    sandbox.assert_nothing_outside_home()


BAD_CONFIGS = [
    ("partition", '[slurm]\npartition = "gpu\\n#SBATCH --time=99:00:00"\n'),
    ("account", '[slurm]\naccount = "a\\rb"\n'),
    ("extra_args[1]", '[slurm]\nextra_args = ["--exclusive", "--x\\nrm"]\n'),
    ("mem_per_gpu", '[slurm]\nmem_per_gpu = "32G\\u0000"\n'),
    ("daemon.grace_seconds", "[daemon]\ngrace_seconds = inf\n"),
    ("daemon.cpu_slots", "[daemon]\ncpu_slots = 99999999999999999999\n"),
]


@pytest.mark.parametrize("field,text", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_config_check_refuses_hostile_values(sandbox, field, text):
    config = sandbox.root / "config.toml"
    config.write_text(text)
    sandbox.mark()
    ran = sandbox.orch("config", "check", config).clean(2)
    assert str(config) in ran.err and field in ran.err, ran.err
    sandbox.assert_nothing_outside_home()


def test_cli_priority_past_64_bits_is_a_usage_error(sandbox):
    job = sandbox.root / "job.toml"
    job.write_text(CMD)
    sandbox.mark()
    ran = sandbox.orch("submit", job, "--priority", str(2**64)).clean(2)
    assert "--priority" in ran.err
    assert _jobs(sandbox.home) == 0
    sandbox.assert_nothing_outside_home()


def test_an_absurd_job_id_is_no_such_job(sandbox):
    sandbox.orch("status").clean(0)
    sandbox.mark()
    for verb in ("show", "cancel", "logs"):
        ran = sandbox.orch(verb, str(10**30)).clean(1)
        assert "no job" in ran.err, ran.err
    sandbox.assert_nothing_outside_home()


def test_show_json_masks_env_values_unless_revealed(sandbox):
    job = sandbox.root / "job.toml"
    job.write_text(CMD + '[env]\nHF_TOKEN = "hf_supersecret"\n')
    sandbox.orch("submit", job).clean(0)
    shown = sandbox.orch("show", "1", "--json").clean(0)
    assert "hf_supersecret" not in shown.out
    assert json.loads(shown.out)["spec"]["env"] == {"HF_TOKEN": "***"}
    revealed = sandbox.orch("show", "1", "--json", "--reveal").clean(0)
    assert json.loads(revealed.out)["spec"]["env"] == {"HF_TOKEN": "hf_supersecret"}
    assert "hf_supersecret" not in sandbox.orch("show", "1").clean(0).out
