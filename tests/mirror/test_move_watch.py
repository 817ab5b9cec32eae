"""The lease holder's reading of move requests (daemon/mirror/moves.py) against a real file://
bucket: a request naming this home is honoured once; one naming another home (a stale request
after the job moved), a closed one, an unreadable object or none at all is left alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.daemon.mirror.moves import MoveWatch
from orchestrator.objectstore import moves
from orchestrator.objectstore.remote import Remote

UID = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def remote(tmp_path: Path, storage_section: Any) -> Remote:
    return Remote(storage_section(f"file://{tmp_path}/store"))


def watch(remote: Remote, home: str = "home-here") -> tuple[MoveWatch, list[str]]:
    asked: list[str] = []
    return MoveWatch(remote, home, lambda job, reason: asked.append(reason)), asked


def request(from_home: str, status: str = moves.ASKED) -> moves.MoveRequest:
    return moves.MoveRequest(UID, "spot", "on-demand", "spot is back", "ctl", 1.0, from_home, "vm-1", status=status)


JOB = SimpleNamespace(id=1, uid=UID)


def test_a_request_naming_this_home_is_honoured_once(remote):
    moves.put_new(remote, request("home-here"))
    w, asked = watch(remote)
    w.check(JOB, 2.0)  # type: ignore[arg-type]
    w.check(JOB, 3.0)  # type: ignore[arg-type]
    assert len(asked) == 1 and "planned move to spot" in asked[0] and "spot is back" in asked[0]


@pytest.mark.parametrize("what", ["other home", "closed", "unreadable", "none"])
def test_anything_else_is_left_alone(remote, what):
    if what == "other home":
        moves.put_new(remote, request("home-elsewhere"))
    elif what == "closed":
        moves.put_new(remote, request("home-here", status=moves.DONE))
    elif what == "unreadable":
        remote.cas_put(moves.move_key(UID), b'{"to": "the moon", "status": "asked"}', None)
    w, asked = watch(remote)
    w.check(JOB, 2.0)  # type: ignore[arg-type]
    assert asked == []
