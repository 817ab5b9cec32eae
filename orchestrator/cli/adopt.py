"""`orch adopt URL [--job ID]... [--all] [--force]`: the command's side (storage/adopt.py does the work)."""

from __future__ import annotations

import sys
from typing import Any


def run_adopt(home: Any, config: Any, store: Any, url: str, *, jobs: list[str], take_all: bool, force: bool,
              maps: list[str] = ()) -> int:
    from ..storage.adopt import adopt_jobs
    from ..wake import poke

    adopted, refused = adopt_jobs(home, config, store, url, wanted=jobs, take_all=take_all, force=force,
                                  say=print, warn=lambda text: print(text, file=sys.stderr), maps=list(maps))
    if adopted and not poke(home.wake_socket):
        print("note: no daemon is running; `orch daemon start` resumes the adopted jobs", file=sys.stderr)
    return 1 if refused else 0
