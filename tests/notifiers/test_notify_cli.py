"""`orch notify test` and `orch config check` against real loopback servers (a WeCom-format
robot, aiosmtpd): each channel's outcome in the provider's own words, `--channel`, and secrets
given as `*_env` that never appear in what orch prints."""

from __future__ import annotations

import socket
from typing import Iterator

import pytest
from daemon_harness import OrchHome, orch_home  # noqa: F401  (fixture)

from notify_servers import PASSWORD, USER, Inbox, ProviderServer, authenticator, free_port

GOOD_KEY = "0b5e7c1a-2d3f-4a6b-8c9d-g00dr0b0tk3y"
DELETED_KEY = "9f8e7d6c-5b4a-4c3d-2e1f-de1e7edr0b07"
WRONG_PASSWORD = "not-the-auth-code-5678"
WECOM_OK = {"errcode": 0, "errmsg": "ok"}
WECOM_BAD_KEY = {
    "errcode": 93000,
    "errmsg": "invalid webhook url, hint: [1712345678_abc], from ip: 10.0.0.1, "
    "more info at https://open.work.weixin.qq.com/devtool/query?e=93000",
}


@pytest.fixture
def robots() -> Iterator[tuple[ProviderServer, ProviderServer]]:
    good, deleted = ProviderServer(), ProviderServer()
    good.reply(200, WECOM_OK)
    deleted.reply(200, WECOM_BAD_KEY)
    yield good, deleted
    good.close()
    deleted.close()


@pytest.fixture
def smtp() -> Iterator[tuple[int, Inbox]]:
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=free_port(),
        authenticator=authenticator,
        auth_required=True,
        auth_require_tls=False,
    )  # plaintext AUTH: loopback only
    controller.start()
    try:
        yield controller.port, inbox
    finally:
        controller.stop()


@pytest.fixture
def configured(orch_home, robots, smtp, monkeypatch) -> OrchHome:
    """Four channels, every secret from the environment: a working robot and mailbox, a robot whose
    key was deleted (errcode 93000), and a mailbox with the wrong password."""
    good, deleted = robots
    smtp_port, _ = smtp
    monkeypatch.setenv("ORCH_TEST_GOOD_URL", f"{good.base_url}/cgi-bin/webhook/send?key={GOOD_KEY}")
    monkeypatch.setenv("ORCH_TEST_DELETED_URL", f"{deleted.base_url}/cgi-bin/webhook/send?key={DELETED_KEY}")
    monkeypatch.setenv("ORCH_TEST_SMTP_PASSWORD", PASSWORD)
    monkeypatch.setenv("ORCH_TEST_WRONG_PASSWORD", WRONG_PASSWORD)
    h = orch_home()
    mail = f'type = "email"\nhost = "127.0.0.1"\nport = {smtp_port}\nusername = "{USER}"\nto = ["{USER}"]\n'
    (h.root / "config.toml").write_text(f"""
[[notifiers]]
type = "wecom"
name = "good"
url_env = "ORCH_TEST_GOOD_URL"

[[notifiers]]
type = "wecom"
name = "deleted"
url_env = "ORCH_TEST_DELETED_URL"

[[notifiers]]
name = "mail"
password_env = "ORCH_TEST_SMTP_PASSWORD"
{mail}
[[notifiers]]
name = "mail-typo"
password_env = "ORCH_TEST_WRONG_PASSWORD"
{mail}""")
    return h


def no_secrets(*texts: str) -> None:
    for text in texts:
        for secret in (GOOD_KEY, DELETED_KEY, PASSWORD, WRONG_PASSWORD):
            assert secret not in text, f"a secret was printed: {text}"
        assert "Traceback" not in text


def test_notify_test_says_ok_or_the_providers_error_for_each_channel(configured, robots, smtp):
    good, deleted = robots
    _, inbox = smtp
    r = configured.cli("notify", "test")
    assert r.returncode == 1, r  # one channel failing fails the command
    lines = r.stdout.splitlines()
    assert "good: ok" in lines and "mail: ok" in lines, r.stdout
    (bad,) = [line for line in lines if line.startswith("deleted: ")]
    assert bad.startswith("deleted: FAILED: invalid webhook url") and "code 93000" in bad and "permanent" in bad
    (typo,) = [line for line in lines if line.startswith("mail-typo: ")]
    assert typo.startswith("mail-typo: FAILED: login refused") and "code 535" in typo, typo
    no_secrets(r.stdout, r.stderr)

    assert len(good.requests) == 1 and len(deleted.requests) == 1
    content = good.last.json()["markdown"]["content"]
    assert content.startswith(f"**[orch] orch on {socket.gethostname()} says hello") and "this channel works" in content
    ((sender, rcpts, mail),) = inbox.envelopes
    assert sender == USER and rcpts == [USER] and "says hello: notifications work" in mail["Subject"]


def test_notify_test_channel_selects_one_and_an_unknown_name_is_a_usage_error(configured, robots, smtp):
    good, deleted = robots
    _, inbox = smtp
    r = configured.cli("notify", "test", "--channel", "good")
    assert (r.returncode, r.stdout) == (0, "good: ok\n"), r
    assert len(good.requests) == 1 and not deleted.requests and not inbox.envelopes

    r = configured.cli("notify", "test", "--channel", "deleted")
    assert r.returncode == 1 and r.stdout.startswith("deleted: FAILED: invalid webhook url"), r
    assert len(good.requests) == 1 and len(deleted.requests) == 1

    r = configured.cli("notify", "test", "--channel", "nope")
    assert r.returncode == 2 and not r.stdout, r
    assert "no notifier named 'nope'" in r.stderr and "good, deleted, mail, mail-typo" in r.stderr
    assert len(good.requests) == 1 and len(deleted.requests) == 1 and not inbox.envelopes
    no_secrets(r.stderr)


def test_config_check_names_the_channels_and_never_their_secrets(configured, monkeypatch):
    r = configured.cli("config", "check")
    assert r.returncode == 0 and "notifiers: good, deleted, mail, mail-typo" in r.stdout, r
    no_secrets(r.stdout, r.stderr)
    monkeypatch.delenv("ORCH_TEST_SMTP_PASSWORD")
    r = configured.cli("config", "check")
    assert r.returncode == 2 and "ORCH_TEST_SMTP_PASSWORD is not set" in r.stderr, r
    no_secrets(r.stdout, r.stderr)
