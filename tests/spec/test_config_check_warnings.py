"""`orch config check` says more than "ok" about a file that works but is unsafe or cannot do what
it says (issue 38): a secret written into config.toml itself (item 3), and `[daemon] gpus` naming
GPUs this machine does not have (item 5). Through the real `orch` command."""

from __future__ import annotations

import json
import os

import pytest

MAIL = """
[[notifiers]]
type = "email"
name = "mail"
host = "smtp.example.com"
port = 465
username = "me@example.com"
to = ["me@example.com"]
"""


@pytest.mark.parametrize(
    "table, key, variable",
    [
        (MAIL + 'password = "hunter2appcode0123456789abcdef"\n', "password", "ORCH_MAIL_PASSWORD"),
        (
            '[[notifiers]]\ntype = "wecom"\nurl = "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=hunter2appcode0123456789abcdef"\n',
            "url",
            "ORCH_WECOM_URL",
        ),
        (
            '[[notifiers]]\ntype = "pushplus"\nname = "pp"\ntoken = "hunter2appcode0123456789abcdef"\n',
            "token",
            "ORCH_PP_TOKEN",
        ),
    ],
)
def test_a_secret_written_in_the_file_is_warned_about_with_the_variable_to_use(orch, tmp_path, table, key, variable):
    path = tmp_path / "config.toml"
    path.write_text(table)
    ran = orch("config", "check", path).assert_ok()
    assert f"{path}: ok" in ran.out
    warning = " ".join(ran.err.split())
    assert f"{key} is written in the file" in warning, ran.err
    assert f'{key}_env = "{variable}"' in warning and f"export {variable}=" in warning
    assert "hunter2appcode0123456789abcdef" not in ran.out + ran.err  # the warning never repeats the secret


@pytest.mark.parametrize(
    "table",
    [
        MAIL + 'password_env = "ORCH_MAIL_PASSWORD"\n',
        '[[notifiers]]\ntype = "webhook"\nurl = "https://example.com/orch"\n',  # a URL with no credential in it
    ],
)
def test_secrets_kept_in_the_environment_pass_without_a_warning(orch, tmp_path, table):
    path = tmp_path / "config.toml"
    path.write_text(table)
    ran = orch("config", "check", path, env={"ORCH_MAIL_PASSWORD": "from-the-environment"}).assert_ok()
    assert "warning" not in ran.err, ran.err


def _nvidia_smi(folder, *gpus: str):
    """An nvidia-smi first on PATH answering as a machine with these GPUs would (none: no line)."""
    folder.mkdir(exist_ok=True)
    exe = folder / "nvidia-smi"
    lines = "".join(f"echo '{g}'\n" for g in gpus)
    exe.write_text(f"#!/bin/sh\n{lines}")
    exe.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    "gpus, listed, found",
    [
        ((), "GPU 0, 1", "nvidia-smi finds no GPU here"),
        (("0, NVIDIA H200, 143771",), "GPU 1", "nvidia-smi finds only GPU 0"),
    ],
)
def test_listed_gpus_this_machine_lacks_are_named_by_config_check_and_doctor(orch, tmp_path, gpus, listed, found):
    path = tmp_path / "config.toml"
    path.write_text("[daemon]\ngpus = [0, 1]\n")
    env = _nvidia_smi(tmp_path / "bin", *gpus)
    checked = orch("config", "check", path, env=env).assert_ok()
    said = " ".join(checked.err.split())
    assert f"[daemon] gpus lists {listed}, which this machine does not have ({found})" in said, checked.err
    doctor = orch("--config", path, "doctor", "--json", env=env)
    findings = [f for f in json.loads(doctor.out) if f["area"] == "gpus"]
    assert findings and findings[0]["level"] == "problem" and f"lists {listed}" in findings[0]["text"], doctor


def test_listed_gpus_that_exist_pass_quietly(orch, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[daemon]\ngpus = [0]\n")
    env = _nvidia_smi(tmp_path / "bin", "0, NVIDIA H200, 143771")
    assert "gpus" not in orch("config", "check", path, env=env).assert_ok().err
