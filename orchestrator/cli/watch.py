"""`orch watch [URL] [--once]`'s printing: the loop itself is orchestrator/watch/loop.py. Here:
where its lines go (a running watch stamps the time and masks secrets; --once prints a plain
table, its gate line on stderr), and `orch status`'s note of the jobs the watch waits on."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Optional

from ..redaction import redact
from ..views.recovery import waiting_line, waiting_rows


def run_watch(home: Any, config: Any, store: Any, url: Optional[str], *, once: bool) -> int:
    from ..watch.loop import Output
    from ..watch.loop import run_watch as loop

    def say(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {redact(text)}", flush=True)

    def start(text: str) -> None:
        print(text, file=sys.stderr if once else sys.stdout, flush=True)

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    return loop(home, config, store, url, once=once, out=Output(say=say, show=print, start=start))


def status_note(store: Any, out: Optional[Any] = None) -> None:
    """`orch status` in a home where `orch watch` runs: the jobs waiting for a machine (views/recovery.py)."""
    now = time.time()
    for row in waiting_rows(store):
        print("recovery: " + waiting_line(row, now), file=out or sys.stderr)
