"""Which jobs go on one machine: the jobs a lost machine held are relaunched together, on one
machine of the right size, in one LaunchRequest (a 4-GPU box running four jobs comes back as one
4-GPU box, not four machines). Pure: the controller collects a pass's placements and launches
each group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..objectstore import claims as cl
from ..objectstore import moves
from ..objectstore.remote import Remote


@dataclass
class Placement:
    """One job the controller decided to launch this pass."""

    uid: str
    manifest: dict[str, Any]
    owner: dict[str, Any]  # the lapsed lease (empty for a job `orch launch` put in the bucket)
    n: int  # its launch number
    market: str
    why: str
    view: Any  # the pass's JobView for the job, updated with what happened
    reuse: Optional[cl.Claim] = None  # a capacity wait's claim, claimed again for this try
    claim: Optional[cl.Claim] = None  # set once claimed
    move: Optional[moves.MoveRequest] = None  # a planned move this launch completes
    # A planned move's new machine, launched while the old one still holds the lease (the move is
    # asked once it is up): the home it will take the job from.
    move_for: str = ""
    zone: str = ""  # with [[recovery.zones]]: the zone it launches in (set when its group is placed)

    @property
    def gpus(self) -> int:
        gpus = self.manifest.get("gpus")
        return gpus if isinstance(gpus, int) and gpus > 0 else 0


@dataclass
class Group:
    market: str
    placements: list[Placement] = field(default_factory=list)

    @property
    def uids(self) -> tuple[str, ...]:
        return tuple(p.uid for p in self.placements)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.placements)

    def key(self) -> str:
        return "launch:" + ",".join(f"{p.uid}:{p.n}" for p in self.placements)


def machine_of(owner: dict[str, Any]) -> Optional[str]:
    """The machine a lease names: its orch home (one per machine), else its instance or host."""
    for k in ("home_id", "instance_id", "host"):
        v = owner.get(k)
        if isinstance(v, str) and v:
            return f"{k}:{v}"
    return None


def group(placements: list[Placement]) -> list[Group]:
    """One group per (lost machine, market), in the order first seen; a job that names no machine
    (never leased) is a group of its own."""
    groups: dict[tuple[str, str], Group] = {}
    for p in placements:
        machine = machine_of(p.owner) or f"job:{p.uid}"
        groups.setdefault((machine, p.market), Group(p.market)).placements.append(p)
    return list(groups.values())


def read_launches(remote: Remote, uid: str) -> int:
    return cl.launches(cl.read_claims(remote, uid))
