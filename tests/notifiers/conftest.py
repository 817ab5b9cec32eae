"""Fixtures for the notifier tests; the servers themselves live in notify_servers.py."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from notify_servers import Inbox, ProviderServer, SmtpServer, authenticator, free_port


@pytest.fixture
def provider() -> Iterator[ProviderServer]:
    server = ProviderServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """(ca_file, cert_file, key_file): a throwaway CA and a certificate for 127.0.0.1."""
    trustme = pytest.importorskip("trustme")
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    return str(ca_file), str(cert_file), str(key_file)


@pytest.fixture(params=["none", "starttls", "ssl"])
def smtp_server(request: pytest.FixtureRequest, tls_files: tuple[str, str, str]) -> Iterator[SmtpServer]:
    """A real SMTP server with AUTH LOGIN/PLAIN in one of the three transport modes."""
    import ssl

    from aiosmtpd.controller import Controller

    ca_file, cert_file, key_file = tls_files
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    inbox = Inbox()
    mode = request.param
    kwargs: dict[str, Any] = {"authenticator": authenticator, "auth_required": True}
    if mode == "none":
        kwargs["auth_require_tls"] = False  # plaintext AUTH only because this is loopback
    elif mode == "starttls":
        kwargs.update(tls_context=context, require_starttls=True, auth_require_tls=True)
    else:
        # aiosmtpd only counts STARTTLS as TLS for auth_require_tls; an implicit-TLS socket is
        # encrypted from the first byte, so requiring it again would just hide AUTH.
        kwargs.update(ssl_context=context, auth_require_tls=False)
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port(), server_hostname="127.0.0.1", **kwargs)
    controller.start()
    try:
        yield SmtpServer(mode, "127.0.0.1", controller.port, inbox, ca_file)
    finally:
        controller.stop()
