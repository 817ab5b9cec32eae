"""What `orch watch` says of a job (JobView and its states, as `orch watch` and `orch status` in the
controller's home show them), and the pure helpers the controller's modules share: what a job's
launch claims say (losses, wasted launches, failures in a row), its deadline, `orch launch`'s record."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from ..model.markets import SPOT
from ..model.states import WATCH_LAUNCHING, WATCH_LEFT_ALONE, WATCH_WAITING
from ..objectstore import claims as cl
from ..spec.jobspec import deadline_ts
from .provider import launched_from_output

UNFINISHED = ("queued", "running")  # a stopped job stays stopped: the user stopped it
MAX_BACKOFF_S = 1800.0

# What a job is doing, as `orch watch` and `orch status` in the controller's home say it.
UNTRUSTED = "not trusted"  # a job in the bucket no machine ever held, not put there by `orch launch` here
ALIVE, WAITING, LAUNCHING, LEFT, RELEASED, DONE, UNREADABLE = (
    "alive",
    WATCH_WAITING,  # for a replacement machine (since `waiting_since`)
    WATCH_LAUNCHING,
    WATCH_LEFT_ALONE,
    "released",
    "finished",
    "unreadable",
)


@dataclass
class JobView:
    uid: str
    name: str
    state: str
    note: str = ""
    waiting_since: Optional[float] = None
    launches: int = 0
    losses: int = 0
    market: str = ""


def launch_key(uid: str) -> str:
    """The controller's record that `orch launch` in its home put job `uid` in the bucket."""
    return f"launch:{uid}"


def timed(call: Callable[[], Any]) -> Callable[[], tuple[float, Any]]:
    def run() -> tuple[float, Any]:
        started = time.monotonic()
        what = call()
        return round(time.monotonic() - started, 3), what

    return run


def hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def deadline_of(m: dict[str, Any]) -> Optional[float]:
    try:
        return deadline_ts((m.get("spec") or {}).get("deadline"))
    except (TypeError, ValueError):
        return None


def count_losses(claims: list[cl.Claim]) -> int:
    """Machines this job has lost: every lapsed lease a launch was claimed for, plus every launched
    machine that never took the job (a later claim for the same lapsed lease)."""
    seen = {cl.lost_identity(c.lost) for c in claims if c.status != cl.CANCELLED and not c.extra.get("move_for")}
    return len(seen) + sum(1 for _ in never_came(claims))


def never_came(claims: list[cl.Claim]) -> Iterator[cl.Claim]:
    """Launched machines that never took the job: a later claim is for the same lapsed lease."""
    later: set[tuple[str, Any]] = set()
    for c in reversed(claims):
        identity = cl.lost_identity(c.lost)
        if c.status == cl.LAUNCHED and identity in later:
            yield c
        later.add(identity)


def claim_instance(claim: cl.Claim) -> str:
    """The id of the machine a launch claim brought up (what `stop` and `alive` are given): the
    `instance_id` its launch returned; for a claim written before orch recorded it, the launch's
    text read by the command provider's rule; "" when no launch returned here (a machine that
    adopted while the controller that launched it was gone)."""
    recorded = claim.extra.get("instance_id")
    if isinstance(recorded, str):
        return recorded
    if not claim.launched or claim.launched.startswith("adopted by "):
        return ""
    return launched_from_output(claim.launched).instance_id


def wasted_launches(claims: list[cl.Claim]) -> int:
    """Launches that did not bring the job back: failed ones, and launched machines that never
    took the job. A machine that ran the job and was reclaimed later (spot) or handed it over (a
    planned move) did its work: it does not count toward max_launches, nor does a capacity wait."""
    failed = sum(1 for c in claims if c.status == cl.FAILED)
    reclaimed = sum(1 for c in never_came(claims) if c.market == SPOT and c.extra.get("gone_while_booting"))
    return failed + sum(1 for _ in never_came(claims)) - reclaimed


def failures_in_row(claims: list[cl.Claim], own: dict[str, Any]) -> int:
    n = 0
    for c in reversed(claims):
        if c.status != cl.FAILED or not c.for_loss(own):
            break
        n += 1
    return n
