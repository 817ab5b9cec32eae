"""build_notifiers: every problem in the [[notifiers]] tables reported at once, one line each
naming the file, the table and the notifier; secrets never printed."""

from __future__ import annotations

from typing import Any

import pytest

from notifiers import CHANNELS, DEFAULT_EVENTS, Notifier, NotifierConfigError, build_notifiers
from orchestrator.model.errors import ConfigError

WECOM_URL = "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa"
EMAIL = {
    "type": "email",
    "name": "me",
    "host": "smtp.qq.com",
    "port": 465,
    "username": "me@qq.com",
    "password_env": "ORCH_SMTP_PASSWORD",
    "to": ["me@qq.com"],
}


def problems(raw: list[dict[str, Any]], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(NotifierConfigError) as caught:
        build_notifiers(raw, env=env or {})
    return caught.value.problems


@pytest.mark.parametrize(
    "table, expected",
    [
        ({**EMAIL, "port": 70000}, "config.toml: notifiers[0] (me): port: must be at most 65535 (got 70000)"),
        (
            {"type": "wecom", "ulr": WECOM_URL},
            "config.toml: notifiers[0] (wecom): unknown key 'ulr' (did you mean 'url'?)",
        ),
        ({"type": "wecom"}, "config.toml: notifiers[0] (wecom): url: is required (or url_env"),
        (
            {"type": "wecom", "url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send"},
            "config.toml: notifiers[0] (wecom): url: must be the robot's webhook URL including ?key=",
        ),
        ({"type": "wecom", "url": "qyapi.weixin.qq.com/send?key=abc"}, "url: must be an http:// or https:// URL"),
        (
            {"type": "wecon", "url": WECOM_URL},
            "type: unknown notifier type 'wecon' (did you mean 'wecom'? known types: apprise, dingtalk, email",
        ),
        ({"url": WECOM_URL}, "config.toml: notifiers[0]: type: is required (one of apprise, dingtalk"),
        (
            {"type": "dingtalk", "url": "https://oapi.dingtalk.com/robot/send?access_token=abc", "secret": "abc123"},
            "secret: must be the robot's signing secret, which starts with 'SEC'",
        ),
        (
            {"type": "dingtalk", "url": "https://oapi.dingtalk.com/robot/send"},
            "url: must be the robot's webhook URL including ?access_token=",
        ),
        ({"type": "serverchan", "sendkey": "sctpXYZ"}, "sendkey: looks like a ServerChan³ key"),
        ({"type": "serverchan", "sendkey": "SCT 123/x"}, "sendkey: must be the SendKey"),
        ({"type": "pushplus", "token": "x"}, "token: must be the PushPlus token"),
        ({"type": "feishu", "url": "https://open.feishu.cn/"}, "url: must be the bot's webhook URL"),
        (
            {"type": "webhook", "url": "http://example.com/h", "events": ["finished"]},
            "events[0]: must be one of 'submitted', 'started'",
        ),
        ({**EMAIL, "to": []}, "to: must not be empty"),
        ({**EMAIL, "to": ["not-an-address"]}, "to: not an e-mail address: 'not-an-address'"),
        ({**EMAIL, "tls": "tls1.3"}, "tls: must be one of 'ssl', 'starttls' or 'none'"),
        ({**EMAIL, "ca_file": "/no/such/ca.pem"}, "ca_file: no such file: /no/such/ca.pem"),
        ({k: v for k, v in EMAIL.items() if k != "port"}, "port: is required (465 for SSL, 587 for STARTTLS)"),
        (
            {**EMAIL, "password": "x", "password_env": "ORCH_SMTP_PASSWORD"},
            "password_env: give either password or password_env, not both",
        ),
    ],
)
def test_each_bad_table_is_one_clear_line(table: dict[str, Any], expected: str) -> None:
    found = problems([table], env={"ORCH_SMTP_PASSWORD": "pw"})
    assert any(expected in line for line in found), found


def test_missing_environment_variable_names_the_notifier_and_the_variable() -> None:
    assert problems([EMAIL]) == [
        "config.toml: notifiers[0] (me): password_env: environment variable ORCH_SMTP_PASSWORD is not set "
        "(export it in the daemon's environment)"
    ]


def test_all_problems_of_all_tables_are_reported_together() -> None:
    found = problems([{**EMAIL, "port": 0}, {"type": "wecom", "ulr": "x"}, {"type": "nope"}, "junk"])  # type: ignore[list-item]
    assert [line.split(":")[1].strip() for line in found] == [
        "notifiers[0] (me)",
        "notifiers[0] (me)",
        "notifiers[1] (wecom)",
        "notifiers[1] (wecom)",
        "notifiers[2] (nope)",
        "notifiers[3]",
    ]


def test_duplicate_names_are_refused() -> None:
    found = problems([{"type": "wecom", "url": WECOM_URL}, {"type": "wecom", "url": WECOM_URL}])
    assert found == [
        "config.toml: notifiers[1] (wecom): name 'wecom' is already used by notifiers[0]; give each notifier a unique name"
    ]
    two = build_notifiers(
        [{"type": "wecom", "url": WECOM_URL}, {"type": "wecom", "name": "lab", "url": WECOM_URL}], env={}
    )
    assert [n.name for n in two] == ["wecom", "lab"]


def test_defaults_name_is_the_type_and_events_are_the_outcomes() -> None:
    (notifier,) = build_notifiers([{"type": "wecom", "url": WECOM_URL}], env={})
    assert isinstance(notifier, Notifier)
    assert notifier.name == "wecom" and notifier.type == "wecom"
    assert (
        notifier.events
        == DEFAULT_EVENTS
        == {
            "succeeded",
            "failed",
            "stopped",
            "preempted",
            "idle_shutdown",
            "loss_flat",
            "hang",
            "mirror_failed",
            "lease_lost",
            "deadline_at_risk",
            "sweep_finished",
            "env_changed",
            "machine_lost",
            "relaunched",
            "relaunch_failed",
            "stop_failed",
            "untrusted",
            "deadline_infeasible",
        }
    )
    assert notifier.min_interval_s == 3.0


def test_label_and_timeout_are_passed_through() -> None:
    with pytest.raises(NotifierConfigError) as caught:
        build_notifiers([{"type": "wecom"}], label="/root/.orch/config.toml", env={})
    assert caught.value.problems[0].startswith("/root/.orch/config.toml: notifiers[0] (wecom): ")
    (notifier,) = build_notifiers([{"type": "wecom", "url": WECOM_URL}], env={}, timeout_s=2.5)
    assert notifier.timeout_s == 2.5


def test_config_error_is_an_orch_config_error_for_the_cli() -> None:
    with pytest.raises(ConfigError):
        build_notifiers([{"type": "nope"}], env={})


def test_every_secret_may_come_from_the_environment() -> None:
    env = {
        "WECOM": WECOM_URL,
        "DING": "https://oapi.dingtalk.com/robot/send?access_token=t0k",
        "DSEC": "SECabc",
        "SCKEY": "SCT1T2abc",
        "PP": "0123456789abcdef",
        "FS": "https://open.feishu.cn/open-apis/bot/v2/hook/abc",
        "PW": "pw",
        "HOOK": "https://example.com/h?token=zzz",
    }
    built = build_notifiers(
        [
            {"type": "wecom", "url_env": "WECOM"},
            {"type": "dingtalk", "url_env": "DING", "secret_env": "DSEC"},
            {"type": "serverchan", "sendkey_env": "SCKEY"},
            {"type": "pushplus", "token_env": "PP"},
            {"type": "feishu", "url_env": "FS", "secret_env": "PW"},
            {**EMAIL, "password_env": "PW"},
            {"type": "webhook", "url_env": "HOOK"},
        ],
        env=env,
    )
    assert [n.type for n in built] == ["wecom", "dingtalk", "serverchan", "pushplus", "feishu", "email", "webhook"]


SECRETS = {
    "wecom": ({"type": "wecom", "url": WECOM_URL}, "693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa"),
    "dingtalk": (
        {
            "type": "dingtalk",
            "url": "https://oapi.dingtalk.com/robot/send?access_token=d1ngT0ken9",
            "secret": "SECs1gn1ngS3cret",
        },
        "d1ngT0ken9",
    ),
    "dingtalk-secret": (
        {
            "type": "dingtalk",
            "url": "https://oapi.dingtalk.com/robot/send?access_token=d1ngT0ken9",
            "secret": "SECs1gn1ngS3cret",
        },
        "SECs1gn1ngS3cret",
    ),
    "feishu": (
        {"type": "feishu", "url": "https://open.feishu.cn/open-apis/bot/v2/hook/f3ishuH00k", "secret": "fsS3cret"},
        "f3ishuH00k",
    ),
    "serverchan": ({"type": "serverchan", "sendkey": "SCT99T0pS3cretKey"}, "SCT99T0pS3cretKey"),
    "serverchan3": ({"type": "serverchan", "sendkey": "sctp42tS3cretKey"}, "sctp42tS3cretKey"),
    "pushplus": ({"type": "pushplus", "token": "pp0123456789S3cret"}, "pp0123456789S3cret"),
    "email": ({**EMAIL, "password": "qqAuthCode16chrs", "password_env": None}, "qqAuthCode16chrs"),
    "webhook": (
        {
            "type": "webhook",
            "url": "https://hooks.example.com/x?token=wh00kT0ken",
            "headers": {"X-Api-Key": "h3aderS3cret"},
        },
        "h3aderS3cret",
    ),
    "webhook-slack": ({"type": "webhook", "url": "https://hooks.slack.com/services/T0/B0/sl4ckS3cret"}, "sl4ckS3cret"),
    "webhook-url": ({"type": "webhook", "url": "https://hooks.example.com/x?token=wh00kT0ken"}, "wh00kT0ken"),
}


@pytest.mark.parametrize("case", list(SECRETS))
def test_secrets_never_appear_in_describe_or_repr(case: str) -> None:
    table, secret = SECRETS[case]
    table = {k: v for k, v in table.items() if v is not None}
    (notifier,) = build_notifiers([table], env={})
    for text in (notifier.describe(), repr(notifier), repr(notifier.config), str(notifier.config)):
        assert secret not in text
    if table.get("url") or table.get("sendkey"):  # the secret is part of the address: shown masked
        assert "***" in notifier.describe() or case.startswith("webhook")
    assert notifier.name in notifier.describe()


@pytest.mark.parametrize("case", ["wecom", "dingtalk", "feishu"])
def test_secrets_never_appear_in_config_errors(case: str) -> None:
    table, secret = SECRETS[case]
    # A malformed URL that still contains the secret must be reported without it.
    broken = {**table, "url": "ftp://" + table["url"].split("://", 1)[1]}
    found = problems([broken])
    assert found and all(secret not in line for line in found), found


def test_every_channel_type_is_registered() -> None:
    assert set(CHANNELS) == {"email", "serverchan", "wecom", "pushplus", "feishu", "dingtalk", "webhook", "apprise"}
