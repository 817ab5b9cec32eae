"""What `orch watch` decides for one job each pass (next_action.py), as data: the facts the decision
reads, the actions it returns, and the facts it may ask for first (`Need`). The executor
(executor.py) performs the actions; nothing here reads or writes anything.

A decision that needs a fact the caller has not gathered yet (a provider's answer to "is machine X
gone?", the market policy's answer for a market and a loss count, the planned move under way, what
a stop would say) returns `Plan(need=...)`: the caller gathers that one fact and asks again. So a
provider question or a policy call happens only where the decision reaches it, as before."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from ..model.states import EventKind
from ..objectstore import claims as cl
from ..objectstore import moves
from .jobview import JobView
from .machines import Seen
from .policy import Decision

ASKING = "asking"  # a provider's answer not in yet (the question runs off the loop)
Gone = Union[Optional[bool], str]  # True gone, False up, None cannot tell, ASKING


def machine_key(machine: Mapping[str, Any]) -> tuple[str, str, str]:
    """What a "gone?" answer is filed under: the machine a lease or a launch names."""
    return tuple(str(machine.get(k) or "") for k in ("instance_id", "home_id", "host"))  # type: ignore[return-value]


@dataclass(frozen=True)
class Rules:
    """The controller's configuration, as the decision reads it."""

    stale_after_s: float
    launch_timeout_s: float
    capacity_retry_s: float  # a capacity wait's next try (the poll)
    poll_s: float  # the base of the failed-launch backoff
    max_launches: int
    changeover_s: float  # a planned move's new machine is ready after this
    provider: str  # the provider's name, for the notes
    pricing: Any = None  # [pricing], for the budget check
    zoned: bool = False  # [[recovery.zones]]: a refused zone is not waited on
    can_stop: bool = True  # the provider can stop machines (else their own [idle] shutdown does)


@dataclass(frozen=True)
class Facts:
    """Everything about one job the decision reads beyond its manifest and claims."""

    uid: str
    rules: Rules
    untrusted: Optional[str] = None  # why the manifest is not trusted (trust.py), None when it is
    content_id: str = ""  # the untrusted manifest's content id (its report is once per content)
    in_flight: Mapping[int, float] = field(default_factory=dict)  # launch n -> since, while its call runs
    gone: Mapping[tuple[str, str, str], Gone] = field(default_factory=dict)  # machine_key -> answer
    decisions: Mapping[tuple[str, int], Decision] = field(default_factory=dict)  # (current, losses) -> policy
    move_read: bool = False  # `move` below was read
    move: Optional[moves.MoveRequest] = None  # the planned move this controller asked, under way
    stops: Mapping[str, str] = field(default_factory=dict)  # instance -> its stop's line once wanted


# -- what a decision may need first ----------------------------------------------------------------


@dataclass(frozen=True)
class NeedGone:
    machine: Mapping[str, Any]  # a lease's owner record, or {"instance_id", "home_id"} of a launch


@dataclass(frozen=True)
class NeedDecision:
    current: str
    losses: int
    claims: tuple[cl.Claim, ...]  # as the decision sees them (the market views note them)


@dataclass(frozen=True)
class NeedMove:
    pass


@dataclass(frozen=True)
class NeedStop:
    instance: str


Need = Union[NeedGone, NeedDecision, NeedMove, NeedStop]


# -- actions -----------------------------------------------------------------------------------------


@dataclass
class WriteClaim:
    """Write the claim (changed by the decision), conditional on its ETag."""

    claim: cl.Claim
    why: str  # "cancelled", "adopted", "gone while booting"


@dataclass(frozen=True)
class AdoptedEarly:
    """Launch n's machine adopted before its launch returned: remember which home it is."""

    n: int
    home: str


@dataclass(frozen=True)
class Report:
    """An event (notified once per key)."""

    key: str
    kind: EventKind
    detail: str


@dataclass
class NoteHolder:
    """A fresh lease names a home: the ledger and the claim learn which launch brought it up."""

    owner: dict[str, Any]
    claims: list[cl.Claim]


@dataclass
class SettleMove:
    """A machine on the new market holds the job: stop the old one; close the move when `close`."""

    move: moves.MoveRequest
    why: str
    close: bool
    state: str  # the stop's line, the move's closing note


@dataclass
class MarkMove:
    move: moves.MoveRequest
    status: str
    note: str


@dataclass(frozen=True)
class Stop:
    """A machine no longer needed: stopped, with retries (stopping.py)."""

    instance: str
    why: str


@dataclass(frozen=True)
class AskMove:
    """Ask the lease holder to hand the job over for market `to` (moving.py); the note says it."""

    to: str
    why: str
    current: str


@dataclass
class Place:
    """Launch n of the job on `market` after the pass (placing.py groups, outcomes.py launches)."""

    n: int
    market: str
    why: str
    owner: dict[str, Any]
    reuse: Optional[cl.Claim] = None  # a capacity wait's claim, claimed again
    move: Optional[moves.MoveRequest] = None  # a planned move this launch completes
    move_for: str = ""  # a planned move's new machine: the home it takes the job from


@dataclass(frozen=True)
class SettleFinished:
    """A finished job: once per controller process, enter its launches in the ledger and refuse a
    move asked too late."""

    state: str


@dataclass(frozen=True)
class Review:
    """The decision changes by itself at `at` (a simulated clock jumps there)."""

    at: float


@dataclass(frozen=True)
class Wait:
    """Nothing to do before `until` (a capacity wait, a backoff)."""

    why: str
    until: float


@dataclass(frozen=True)
class LeaveAlone:
    """Never launched again by this controller (max_launches, the budget): adopt it by hand."""

    why: str


Action = Union[
    WriteClaim,
    AdoptedEarly,
    Report,
    NoteHolder,
    SettleMove,
    MarkMove,
    Stop,
    AskMove,
    Place,
    SettleFinished,
    Review,
    Wait,
    LeaveAlone,
]


@dataclass
class Plan:
    """What next_action returns: the actions in order and the view they leave, or the fact needed
    first (then nothing else)."""

    view: Optional[JobView] = None
    actions: list[Action] = field(default_factory=list)
    seen: Optional[Seen] = None  # what the machine ledger's accounting learns of the job (None: nothing)
    need: Optional[Need] = None

    def of(self, kind: type) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]
