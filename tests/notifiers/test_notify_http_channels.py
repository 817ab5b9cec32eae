"""Every HTTP channel against a real loopback server speaking the provider's documented format:
what the notifier sends (path, method, content type, body, signature) and what it reports for
success, a provider error on HTTP 200, throttling, HTTP 500, a non-JSON answer and a timeout."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from notifiers import Message, NotifyError, build_notifiers

MESSAGE = Message(
    event="failed",
    job_id=7,
    job_name="sst2-bert",
    state="failed",
    reason="exit code 1",
    attempt=2,
    duration_s=3725,
    cost=12.5,
    currency="CNY",
    best_metric="val_acc=0.931",
    checkpoint="/ckpt/step-00000500.ckpt",
    host="autodl-container-1",
    log_tail="epoch 1\nRuntimeError: CUDA error",
)

WECOM_KEY = "693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa"
DING_TOKEN = "b1e2c3d4e5f60718293a4b5c6d7e8f90"
DING_SECRET = "SEC4f0c9b8a7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0"
FEISHU_TOKEN = "0b9f3c2e-4d5a-4f6b-8c7d-9e0f1a2b3c4d"
FEISHU_SECRET = "feishuSigningSecret42"
SCT_KEY = "SCT123456TabcdefGHIJKLmnop"
SC3_KEY = "sctp4321tQwErTyUiOp1234"
PUSHPLUS_TOKEN = "0123456789abcdef0123456789abcdef"
BEARER = "Bearer whk-s3cr3t-token-xyz"


@dataclass
class Channel:
    """How to point one channel at the loopback server and what the provider answers."""

    config: Callable[[str], dict[str, Any]]
    secrets: tuple[str, ...]
    ok: tuple[int, Any]
    provider_error: tuple[int, Any, Any]  # (status, body, expected code) for a bad key / auth problem
    throttled: tuple[int, Any, Any, float | None, dict[str, str]]  # status, body, code, retry_after, headers


CHANNELS: dict[str, Channel] = {
    "wecom": Channel(
        lambda base: {"type": "wecom", "url": f"{base}/cgi-bin/webhook/send?key={WECOM_KEY}"},
        (WECOM_KEY,),
        (200, {"errcode": 0, "errmsg": "ok"}),
        (200, {"errcode": 93000, "errmsg": "invalid webhook url, hint: [1]"}, 93000),
        (200, {"errcode": 45009, "errmsg": "api freq out of limit"}, 45009, 60.0, {}),
    ),
    "dingtalk": Channel(
        lambda base: {"type": "dingtalk", "url": f"{base}/robot/send?access_token={DING_TOKEN}", "secret": DING_SECRET},
        (DING_TOKEN, DING_SECRET),
        (200, {"errcode": 0, "errmsg": "ok"}),
        (200, {"errcode": 310000, "errmsg": "sign not match"}, 310000),
        (200, {"errcode": 130101, "errmsg": "send too fast, exceed 20 times per minute"}, 130101, 600.0, {}),
    ),
    "feishu": Channel(
        lambda base: {"type": "feishu", "url": f"{base}/open-apis/bot/v2/hook/{FEISHU_TOKEN}", "secret": FEISHU_SECRET},
        (FEISHU_TOKEN, FEISHU_SECRET),
        (200, {"code": 0, "msg": "success", "data": {}}),
        (200, {"code": 19021, "msg": "sign match fail or timestamp is not within one hour from current time"}, 19021),
        (400, {"code": 11232, "msg": "frequency limited psm[lark.oapi.app_platform_runtime]appID[1]"}, 11232, 60.0, {}),
    ),
    "serverchan": Channel(
        lambda base: {"type": "serverchan", "sendkey": SCT_KEY, "base_url": base},
        (SCT_KEY,),
        (200, {"code": 0, "message": "", "data": {"pushid": "1", "readkey": "r"}}),
        (200, {"code": 40001, "message": "bad pushtoken"}, 40001),
        (429, "slow down", 429, 30.0, {"Retry-After": "30"}),
    ),
    "pushplus": Channel(
        lambda base: {"type": "pushplus", "token": PUSHPLUS_TOKEN, "base_url": base},
        (PUSHPLUS_TOKEN,),
        (200, {"code": 200, "msg": "请求成功", "data": "6a1f"}),
        (200, {"code": 903, "msg": "无效的用户token"}, 903),
        (200, {"code": 900, "msg": "用户账号使用受限"}, 900, 3600.0, {}),
    ),
    "webhook": Channel(
        lambda base: {"type": "webhook", "url": f"{base}/hooks/orch", "headers": {"Authorization": BEARER}},
        (BEARER.split()[1],),
        (200, {"received": True}),
        (401, {"error": "bad token"}, 401),
        (429, "slow down", 429, 30.0, {"Retry-After": "30"}),
    ),
}


def build(config: dict[str, Any], timeout_s: float = 5.0) -> Any:
    (notifier,) = build_notifiers([config], env={}, timeout_s=timeout_s)
    return notifier


def assert_no_secret(secrets: tuple[str, ...], *texts: str) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"secret leaked into: {text}"


@pytest.mark.parametrize("channel", list(CHANNELS))
@pytest.mark.parametrize("case", ["ok", "provider_error", "throttled", "http_500", "not_json", "timeout"])
def test_channel_reports_each_provider_answer(provider: Any, channel: str, case: str) -> None:
    spec = CHANNELS[channel]
    notifier = build(spec.config(provider.base_url), timeout_s=0.5 if case == "timeout" else 5.0)
    # (retryable, code, retry_after) expected; None = delivered.
    expected: tuple[bool, Any, float | None] | None
    if case == "ok":
        provider.reply(*spec.ok)
        expected = None
    elif case == "provider_error":
        status, body, code = spec.provider_error
        provider.reply(status, body)
        expected = (False, code, None)
    elif case == "throttled":
        status, body, code, retry_after, headers = spec.throttled
        provider.reply(status, body, headers=headers)
        expected = (True, code, retry_after)
    elif case == "http_500":
        provider.reply(500, "<html>Internal Server Error</html>")
        expected = (True, 500, None)
    elif case == "not_json":
        provider.reply(200, "<html>captive portal</html>")
        expected = None if channel == "webhook" else (True, "bad-response", None)
    else:
        provider.reply(*spec.ok, delay_s=1.5)
        expected = (True, "timeout", None)

    if expected is None:
        notifier.send(MESSAGE)
    else:
        with pytest.raises(NotifyError) as caught:
            notifier.send(MESSAGE)
        error = caught.value
        assert (error.retryable, error.code, error.retry_after) == expected
        assert error.channel == channel
        assert error.provider_message
        assert_no_secret(spec.secrets, str(error), repr(error), error.provider_message)
    assert len(provider.requests) == 1
    assert_no_secret(spec.secrets, notifier.describe(), repr(notifier))


def test_provider_message_is_the_providers_own_words(provider: Any) -> None:
    notifier = build(CHANNELS["wecom"].config(provider.base_url))
    provider.reply(200, {"errcode": 93000, "errmsg": "invalid webhook url, hint: [1]"})
    with pytest.raises(NotifyError) as caught:
        notifier.send(MESSAGE)
    assert caught.value.provider_message == "invalid webhook url, hint: [1]"
    assert "wecom" in str(caught.value) and "93000" in str(caught.value)


def test_unreachable_server_is_a_retryable_connection_error(provider: Any) -> None:
    base = provider.base_url
    provider.close()  # nothing listens there any more
    with pytest.raises(NotifyError) as caught:
        build(CHANNELS["wecom"].config(base)).send(MESSAGE)
    assert (caught.value.retryable, caught.value.code) == (True, "connection")
    assert WECOM_KEY not in str(caught.value)


@pytest.mark.parametrize("status, retryable", [(401, False), (403, False), (404, False), (502, True), (503, True)])
def test_http_status_without_provider_body_decides(provider: Any, status: int, retryable: bool) -> None:
    provider.reply(status, "nope")
    with pytest.raises(NotifyError) as caught:
        build(CHANNELS["dingtalk"].config(provider.base_url)).send(MESSAGE)
    assert (caught.value.retryable, caught.value.code) == (retryable, status)


# ---- request shapes, as each provider documents them ------------------------------------


def test_wecom_posts_markdown_to_the_robot_url_with_its_key(provider: Any) -> None:
    provider.reply(200, {"errcode": 0, "errmsg": "ok"})
    build(CHANNELS["wecom"].config(provider.base_url)).send(MESSAGE)
    request = provider.last
    assert (request.method, request.path, request.query) == ("POST", "/cgi-bin/webhook/send", {"key": [WECOM_KEY]})
    assert request.headers["content-type"].startswith("application/json")
    body = request.json()
    assert body["msgtype"] == "markdown"
    content = body["markdown"]["content"]
    assert "[orch] job 7 sst2-bert failed" in content and "val_acc=0.931" in content and "CUDA error" in content


def test_wecom_truncates_markdown_to_4096_utf8_bytes(provider: Any) -> None:
    provider.reply(200, {"errcode": 0, "errmsg": "ok"})
    long_chinese = Message(event="failed", job_id=1, job_name="训练", reason="显存不足" * 2000)
    build(CHANNELS["wecom"].config(provider.base_url)).send(long_chinese)
    content = provider.last.json()["markdown"]["content"]
    assert len(content.encode("utf-8")) <= 4096
    assert len(content.encode("utf-8")) > 4000  # cut at the limit, not far below it
    assert content.endswith("(truncated)")


def test_dingtalk_signs_the_url_with_hmac_of_timestamp_and_secret(provider: Any) -> None:
    provider.reply(200, {"errcode": 0, "errmsg": "ok"})
    build(CHANNELS["dingtalk"].config(provider.base_url)).send(MESSAGE)
    request = provider.last
    assert request.path == "/robot/send"
    assert request.query["access_token"] == [DING_TOKEN]
    timestamp = request.query["timestamp"][0]
    assert abs(int(timestamp) / 1000 - time.time()) < 60  # milliseconds, now
    expected = base64.b64encode(
        hmac.new(DING_SECRET.encode(), f"{timestamp}\n{DING_SECRET}".encode(), hashlib.sha256).digest()
    ).decode()
    assert request.query["sign"] == [expected]
    body = request.json()
    assert body["msgtype"] == "markdown"
    assert body["markdown"]["title"] == "[orch] job 7 sst2-bert failed"
    assert "val_acc=0.931" in body["markdown"]["text"]
    assert DING_SECRET not in request.body.decode()


def test_dingtalk_without_secret_sends_no_signature(provider: Any) -> None:
    provider.reply(200, {"errcode": 0, "errmsg": "ok"})
    config = {k: v for k, v in CHANNELS["dingtalk"].config(provider.base_url).items() if k != "secret"}
    build(config).send(MESSAGE)
    assert set(provider.last.query) == {"access_token"}


def test_feishu_puts_timestamp_and_signature_in_the_body(provider: Any) -> None:
    provider.reply(200, {"code": 0, "msg": "success", "data": {}})
    build(CHANNELS["feishu"].config(provider.base_url)).send(MESSAGE)
    request = provider.last
    assert request.path == f"/open-apis/bot/v2/hook/{FEISHU_TOKEN}"
    body = request.json()
    assert body["msg_type"] == "text"
    assert "[orch] job 7 sst2-bert failed" in body["content"]["text"]
    timestamp = body["timestamp"]
    assert isinstance(timestamp, str) and abs(int(timestamp) - time.time()) < 60  # seconds, now
    # Feishu: HMAC-SHA256 keyed with "timestamp\nsecret" over an empty message, base64.
    key = f"{timestamp}\n{FEISHU_SECRET}".encode()
    assert body["sign"] == base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def test_feishu_keeps_the_body_under_20_kb(provider: Any) -> None:
    provider.reply(200, {"code": 0, "msg": "success", "data": {}})
    build(CHANNELS["feishu"].config(provider.base_url)).send(Message(event="failed", reason="错" * 20000))
    assert len(provider.last.body) <= 20 * 1024


def test_serverchan_turbo_key_posts_json_title_and_desp(provider: Any) -> None:
    provider.reply(200, {"code": 0, "message": "", "data": {}})
    build(CHANNELS["serverchan"].config(provider.base_url)).send(MESSAGE)
    request = provider.last
    assert request.path == f"/{SCT_KEY}.send"
    assert request.headers["content-type"].startswith("application/json")
    body = request.json()
    assert len(body["title"]) <= 32 and body["title"].startswith("[orch] job 7")
    assert "val_acc=0.931" in body["desp"]


def test_serverchan3_key_routes_to_its_uid_host(provider: Any) -> None:
    provider.reply(200, {"code": 0, "message": "", "data": {}})
    # Real SC3 hosts are https://<uid>.push.ft07.com; on loopback the uid goes in the path.
    build({"type": "serverchan", "sendkey": SC3_KEY, "base_url": provider.base_url + "/{uid}"}).send(MESSAGE)
    assert provider.last.path == f"/4321/send/{SC3_KEY}.send"


def test_serverchan_default_hosts_follow_the_official_routing_rule() -> None:
    turbo = build({"type": "serverchan", "sendkey": SCT_KEY})
    sc3 = build({"type": "serverchan", "sendkey": SC3_KEY})
    assert turbo.url() == f"https://sctapi.ftqq.com/{SCT_KEY}.send"
    assert sc3.url() == f"https://4321.push.ft07.com/send/{SC3_KEY}.send"
    assert SCT_KEY not in turbo.describe() and SC3_KEY not in sc3.describe()


def test_pushplus_posts_token_title_html_content_and_topic(provider: Any) -> None:
    provider.reply(200, {"code": 200, "msg": "请求成功", "data": "6a1f"})
    build({**CHANNELS["pushplus"].config(provider.base_url), "topic": "lab"}).send(MESSAGE)
    request = provider.last
    assert request.path == "/send"
    body = request.json()
    assert body["token"] == PUSHPLUS_TOKEN and body["topic"] == "lab" and body["template"] == "html"
    assert body["title"] == "[orch] job 7 sst2-bert failed"
    assert "<table>" in body["content"] and PUSHPLUS_TOKEN not in body["content"]


def test_generic_webhook_posts_the_event_as_json_with_configured_headers(provider: Any) -> None:
    provider.reply(204, "")
    build(CHANNELS["webhook"].config(provider.base_url)).send(MESSAGE)
    request = provider.last
    assert request.path == "/hooks/orch"
    assert request.headers["authorization"] == BEARER
    body = request.json()
    assert body["event"] == "failed" and body["title"] == "[orch] job 7 sst2-bert failed"
    assert Message.from_dict(body["message"]) == MESSAGE


def test_a_token_in_the_log_tail_is_masked_before_it_leaves(provider: Any) -> None:
    provider.reply(200, {"errcode": 0, "errmsg": "ok"})
    leaky = Message(event="failed", job_id=3, log_tail="HF_TOKEN=hf_AbCdEf123456 python train.py\nboom")
    build(CHANNELS["wecom"].config(provider.base_url)).send(leaky)
    content = provider.last.json()["markdown"]["content"]
    assert "hf_AbCdEf123456" not in content and "boom" in content
