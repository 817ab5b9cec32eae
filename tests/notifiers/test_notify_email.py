"""E-mail against a real aiosmtpd server on loopback, in plain, STARTTLS and implicit-TLS modes,
with AUTH; the received message is parsed back and checked part by part."""

from __future__ import annotations

from typing import Any

import pytest
from notify_servers import PASSWORD, USER, free_port

from notifiers import Message, NotifyError, build_notifiers

# aiosmtpd warns whenever AUTH is allowed without STARTTLS; the plain mode does that on loopback
# on purpose, and implicit TLS looks the same to it.
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")

MESSAGE = Message(
    event="succeeded",
    job_id=7,
    job_name="sst2-bert",
    state="succeeded",
    attempt=1,
    duration_s=5400,
    cost=9.9,
    currency="CNY",
    best_metric="val_acc=0.931",
    checkpoint="/ckpt/best.ckpt",
    host="lab-box",
)


def email_config(server: Any, **overrides: Any) -> dict[str, Any]:
    config = {
        "type": "email",
        "name": "me",
        "host": server.host,
        "port": server.port,
        "tls": server.mode,
        "ca_file": server.ca_file,
        "username": USER,
        "password_env": "ORCH_SMTP_PASSWORD",
        "to": ["me@example.com", "lab@example.org"],
    }
    config.update(overrides)
    return config


def build(config: dict[str, Any], timeout_s: float = 5.0) -> Any:
    (notifier,) = build_notifiers([config], env={"ORCH_SMTP_PASSWORD": PASSWORD}, timeout_s=timeout_s)
    return notifier


def test_email_delivers_one_mime_message_with_text_and_html_parts(smtp_server: Any) -> None:
    build(email_config(smtp_server)).send(MESSAGE)

    ((mail_from, rcpt_tos, mail),) = smtp_server.inbox.envelopes
    assert mail_from == USER
    assert rcpt_tos == ["me@example.com", "lab@example.org"]
    assert mail["Subject"] == "[orch] job 7 sst2-bert succeeded"
    assert mail["From"] == USER
    assert mail["To"] == "me@example.com, lab@example.org"
    assert mail["Message-ID"] and mail["Date"]
    assert mail.get_content_type() == "multipart/alternative"
    text = mail.get_body(preferencelist=("plain",)).get_content()
    html = mail.get_body(preferencelist=("html",)).get_content()
    assert "Best metric: val_acc=0.931" in text and "Duration: 1h 30m" in text and "Cost: 9.90 CNY" in text
    assert "<table>" in html and "val_acc=0.931" in html
    assert PASSWORD not in mail.as_string()


def test_wrong_password_is_a_permanent_error_with_the_smtp_code(smtp_server: Any) -> None:
    notifier = build_notifiers([email_config(smtp_server)], env={"ORCH_SMTP_PASSWORD": "wrong-password-1"})[0]
    with pytest.raises(NotifyError) as caught:
        notifier.send(MESSAGE)
    assert (caught.value.retryable, caught.value.code) == (False, 535)
    assert "授权码" in str(caught.value)  # the hint QQ/163 users need
    assert "wrong-password-1" not in str(caught.value) + repr(caught.value)
    assert smtp_server.inbox.envelopes == []


@pytest.mark.parametrize("smtp_server", ["ssl", "starttls"], indirect=True)
def test_untrusted_certificate_is_refused_without_ca_file(smtp_server: Any) -> None:
    config = {k: v for k, v in email_config(smtp_server).items() if k != "ca_file"}
    with pytest.raises(NotifyError) as caught:
        build(config).send(MESSAGE)
    assert (caught.value.retryable, caught.value.code) == (False, "tls")
    assert "ca_file" in str(caught.value)


def test_nothing_listening_is_retryable() -> None:
    config = {
        "type": "email",
        "host": "127.0.0.1",
        "port": free_port(),
        "tls": "none",
        "sender": "orch@example.com",
        "to": ["me@example.com"],
    }
    with pytest.raises(NotifyError) as caught:
        build(config, timeout_s=2).send(MESSAGE)
    assert caught.value.retryable and caught.value.code == "connection"


@pytest.mark.parametrize(
    "port, tls, expected",
    [
        (465, None, ("ssl", 465)),
        (587, None, ("starttls", 587)),
        (2525, None, ("none", 2525)),
        (2525, "ssl", ("ssl", 2525)),
        (None, "starttls", ("starttls", 587)),
    ],
)
def test_tls_mode_follows_the_port_unless_tls_says_otherwise(port: Any, tls: Any, expected: Any) -> None:
    config = {
        "type": "email",
        "host": "smtp.qq.com",
        "username": "me@qq.com",
        "password": "abcdabcdabcdabcd",
        "to": ["me@qq.com"],
    }
    config.update({k: v for k, v in {"port": port, "tls": tls}.items() if v is not None})
    notifier = build(config)
    assert (notifier.config.effective_tls, notifier.config.effective_port) == expected
    assert "abcdabcdabcdabcd" not in notifier.describe() + repr(notifier) + repr(notifier.config)


def test_a_server_that_never_greets_is_a_retryable_timeout() -> None:
    import socket

    with socket.socket() as silent:  # accepts connections (backlog) but never says 220
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        config = {
            "type": "email",
            "host": "127.0.0.1",
            "port": silent.getsockname()[1],
            "tls": "none",
            "sender": "orch@example.com",
            "to": ["me@example.com"],
        }
        with pytest.raises(NotifyError) as caught:
            build(config, timeout_s=0.5).send(MESSAGE)
    assert caught.value.retryable and "timed out" in caught.value.provider_message
