"""`orch config check` says more than "ok" about a file that works but is unsafe or cannot do what
it says (issue 38): a secret written into config.toml itself (item 3), and `[daemon] gpus` naming
GPUs this machine does not have (item 5). Through the real `orch` command."""

from __future__ import annotations

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
