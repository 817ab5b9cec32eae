"""E-mail over SMTP: implicit TLS (465), STARTTLS (587) or plain, optional login, one MIME
message with a text and an HTML part. (Absolute imports: `email.*` below is the stdlib.)"""

from __future__ import annotations

import logging
import smtplib
import socket
import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid, parseaddr
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from .base import Message
from .channel import Channel
from .config import ChannelConfig, secret

log = logging.getLogger("orch.notify")

_TLS_BY_PORT = {465: "ssl", 587: "starttls"}
_PORT_BY_TLS = {"ssl": 465, "starttls": 587, "none": 25}


def _is_address(value: str) -> bool:
    _, addr = parseaddr(value)
    local, _, domain = addr.partition("@")
    return bool(local and domain and " " not in addr)


class EmailConfig(ChannelConfig):
    host: str = Field(min_length=1)
    port: int | None = Field(default=None, ge=1, le=65535)
    tls: Literal["ssl", "starttls", "none"] | None = None
    ca_file: Path | None = None
    username: str | None = Field(default=None, min_length=1)
    password: SecretStr | None = None
    sender: str | None = None
    to: list[str] = Field(min_length=1)

    @field_validator("to")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        bad = [a for a in value if not _is_address(a)]
        if bad:
            raise ValueError(f"not an e-mail address: {', '.join(map(repr, bad))}")
        return value

    @field_validator("ca_file")
    @classmethod
    def _ca_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.expanduser().is_file():
            raise ValueError(f"no such file: {value}")
        return value.expanduser() if value is not None else None

    @model_validator(mode="after")
    def _complete(self) -> EmailConfig:
        if self.port is None and self.tls is None:
            raise ValueError("port: is required (465 for SSL, 587 for STARTTLS)")
        if self.password is not None and not self.username:
            raise ValueError("username: is required when a password is given (usually the full address)")
        sender = self.sender or self.username
        if not sender or not _is_address(sender):
            raise ValueError("sender: give the From address (or a username that is an e-mail address)")
        return self

    @property
    def effective_tls(self) -> str:
        return self.tls or _TLS_BY_PORT.get(self.port or 0, "none")

    @property
    def effective_port(self) -> int:
        return self.port or _PORT_BY_TLS[self.effective_tls]


class EmailNotifier(Channel):
    type = "email"
    Config = EmailConfig
    secret_keys = ("password",)
    config: EmailConfig

    def _target(self) -> str:
        c = self.config
        login = f" as {c.username}" if c.username else ""
        return f"smtp {c.host}:{c.effective_port} ({c.effective_tls}){login} to {', '.join(c.to)}"

    def build(self, message: Message) -> EmailMessage:
        mail = EmailMessage()
        mail["Subject"] = message.title()
        mail["From"] = self.config.sender or self.config.username or ""
        mail["To"] = ", ".join(self.config.to)
        mail["Date"] = formatdate(localtime=True)
        mail["Message-ID"] = make_msgid(domain=self.config.host)
        png = message.curve_png()  # end-of-job messages: the loss curve, inline in the HTML part
        html = message.html()
        cid = make_msgid(domain="orch.local")
        if png:
            html = html.replace(
                "</body>", f'<p><img src="cid:{cid[1:-1]}" alt="loss curve" width="480" height="240"></p></body>', 1
            )
        mail.set_content(message.text())
        mail.add_alternative(html, subtype="html")
        if png:
            parts: Any = mail.get_payload()
            html_part = parts[1]  # the alternative just added (an EmailMessage)
            html_part.add_related(
                png, maintype="image", subtype="png", cid=cid, filename="loss-curve.png", disposition="inline"
            )
        return mail

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.config.ca_file:
            context.load_verify_locations(cafile=str(self.config.ca_file))
        return context

    def _connect(self) -> smtplib.SMTP:
        c, mode = self.config, self.config.effective_tls
        if mode == "ssl":
            return smtplib.SMTP_SSL(c.host, c.effective_port, timeout=self.timeout_s, context=self._tls_context())
        smtp = smtplib.SMTP(c.host, c.effective_port, timeout=self.timeout_s)
        if mode == "starttls":
            try:
                smtp.starttls(context=self._tls_context())
            except BaseException:
                smtp.close()
                raise
        return smtp

    def send(self, message: Message) -> None:
        mail = self.build(message)
        try:
            with self._connect() as smtp:
                if self.config.username and self.config.password is not None:
                    smtp.login(self.config.username, secret(self.config.password))
                refused = smtp.send_message(mail)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            text = "; ".join(f"{addr}: {code} {_decode(msg)}" for addr, (code, msg) in exc.recipients.items())
            raise self.error(
                f"every recipient was refused: {text}",
                retryable=all(400 <= c < 500 for c in codes),
                code=codes[0] if codes else None,
            ) from None
        except smtplib.SMTPAuthenticationError as exc:
            raise self.error(
                f"login refused: {_decode(exc.smtp_error)} (for QQ/163 mail use the 授权码, not the account password)",
                retryable=False,
                code=exc.smtp_code,
            ) from None
        except smtplib.SMTPNotSupportedError as exc:
            raise self.error(f"the server does not support this: {exc}", retryable=False, code="unsupported") from None
        except smtplib.SMTPResponseException as exc:
            # SMTP's own rule: 4xx is transient, 5xx is permanent.
            raise self.error(
                _decode(exc.smtp_error), retryable=400 <= exc.smtp_code < 500, code=exc.smtp_code
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise self.error(
                f"TLS certificate not trusted: {exc.verify_message} (set ca_file for a private CA)",
                retryable=False,
                code="tls",
            ) from None
        except (socket.timeout, TimeoutError):
            raise self.error(f"no answer within {self.timeout_s:g} s", retryable=True, code="timeout") from None
        except (smtplib.SMTPException, ssl.SSLError, OSError) as exc:
            raise self.error(f"{type(exc).__name__}: {exc}", retryable=True, code="connection") from None
        if refused:
            # Some recipients got it; resending would duplicate theirs, so report and move on.
            log.warning("%s: these recipients were refused: %s", self.name, ", ".join(sorted(refused)))


def _decode(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
