"""`orch notify test`: one test message through each configured channel, reporting each
channel's outcome with the provider's own error text."""

from __future__ import annotations

import socket
import sys
from typing import Optional

from .config import Config, build_channels
from .errors import UsageError


def send_test(config: Config, channel: Optional[str] = None) -> int:
    from notifiers import Message, NotifyError

    channels = build_channels(config)
    if channel is not None:
        channels = [c for c in channels if c.name == channel]
        if not channels:
            names = ", ".join(n for n, _ in config.routes()) or "none configured"
            raise UsageError(f"--channel: no notifier named {channel!r} (configured: {names})")
    if not channels:
        print("no notifiers configured: add [[notifiers]] to config.toml (see README, Notifications)", file=sys.stderr)
        return 1
    msg = Message(event="test", job_name="orch notify test", state="ok", host=socket.gethostname(),
                  reason="a test message from `orch notify test`: this channel works")
    failed = 0
    for ch in channels:
        try:
            ch.send(msg)
            print(f"{ch.name}: ok")
        except NotifyError as exc:
            failed += 1
            print(f"{ch.name}: FAILED: {exc}")
    return 1 if failed else 0
