"""The optional Apprise channel: a clear config error without the package; with it, a real
delivery to a loopback JSON endpoint (Apprise's json:// service)."""

from __future__ import annotations

from typing import Any

import pytest

from notifiers import Message, NotifierConfigError, build_notifiers
from notifiers.apprise_channel import apprise_installed


@pytest.mark.skipif(apprise_installed(), reason="apprise is installed")
def test_apprise_type_without_the_package_is_a_config_error_saying_what_to_install() -> None:
    with pytest.raises(NotifierConfigError) as caught:
        build_notifiers([{"type": "apprise", "name": "tg", "urls": ["tgram://bot/chat"]}], env={})
    assert caught.value.problems == [
        "config.toml: notifiers[0] (tg): type 'apprise' needs the apprise package: pip install 'orch-gpu[apprise]'"
    ]


@pytest.mark.skipif(not apprise_installed(), reason="apprise is not installed (optional)")
def test_apprise_delivers_through_its_json_service(provider: Any) -> None:
    provider.reply(200, {})
    url = provider.base_url.replace("http://", "json://") + "/hook?token=apprS3cret"
    (notifier,) = build_notifiers([{"type": "apprise", "urls": [url]}], env={})
    notifier.send(Message("succeeded", 1, "j"))
    assert provider.last.json()["title"] == "[orch] job 1 j succeeded"
    assert "apprS3cret" not in notifier.describe()
