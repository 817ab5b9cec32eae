"""`orch notify test`: one test message through each configured channel, reporting each
channel's outcome with the provider's own error text."""

from __future__ import annotations

import socket
import sys
from typing import Optional

from ..jobs.notify import build_channels
from ..spec.config import Config
from ..model.errors import UsageError
from ..redaction import redact


def send_test(config: Config, channel: Optional[str] = None) -> int:
    from notifiers import Message, NotifyError

    channels = build_channels(config)
    if channel is not None:
        channels = [c for c in channels if c.name == channel]
        if not channels:
            names = ", ".join(n for n, _ in config.routes()) or "none configured"
            raise UsageError(f"--channel: no notifier named {channel!r} (configured: {names})")
    if not channels:
        print("no notifiers configured: add [[notifiers]] to config.toml (see docs/notifications.md)", file=sys.stderr)
        return 1
    msg = Message(
        event="test",
        job_name="",  # no job: the title says which machine's orch is testing ("orch on HOST")
        state="ok",
        host=socket.gethostname(),
        reason="a test message from `orch notify test`: this channel works",
    )
    failed = 0
    for ch in channels:
        try:
            ch.send(msg)
            print(f"{ch.name}: ok")
        except NotifyError as exc:
            failed += 1
            # exc.summary, not str(exc): that starts with the channel's name, printed already.
            kind = "temporary: the daemon would retry it" if exc.retryable else "permanent: check the notifier's config"
            print(f"{ch.name}: FAILED: {exc.summary} [{kind}]")
        except Exception as exc:  # a bug in one channel must not hide the others' results
            failed += 1
            scrub = getattr(ch, "scrub", redact)  # masks this channel's own secret values too
            print(f"{ch.name}: FAILED: {type(exc).__name__}: {scrub(str(exc))}")
    return 1 if failed else 0
