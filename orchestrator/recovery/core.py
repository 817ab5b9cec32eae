"""The controller's state and what every part of its pass uses: the manifest reader, the market
policy's call, provider questions, claim updates, events, planned moves asked. controller.py
puts the parts together (jobpass.py, outcomes.py, finishing.py)."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from typing import Any, Callable, Optional

from ..jobs.lifecycle import outgoing_for
from ..model.markets import ON_DEMAND, SPOT
from ..model.states import EventKind
from ..objectstore import claims as cl
from ..objectstore import manifest as mf
from ..objectstore import moves
from ..objectstore.manifest_model import MAX_MANIFEST_BYTES, ManifestError
from ..objectstore.manifest_model import parse as parse_manifest
from ..objectstore.remote import Conflict, Remote, TooLarge
from ..objectstore.signing import Keys
from ..redaction import redact
from ..spec.config import Config
from ..store import Store
from . import deciding as dc
from . import moving as mv
from . import zones as zn
from .jobview import JobView, deadline_of
from .launcher import InlineLauncher, Launcher, Outcome
from .ledger import Ledger
from .machines import MachineBook, Seen
from .placing import Group, Placement
from .policy import Decision, decide
from .provider import Provider
from .stopping import Stopper
from .trust import TrustGate

ASKING = "asking"  # _gone: the provider's answer is not in yet (the call runs off the loop)
ALIVE_PREFIX = "alive:"

log = logging.getLogger("orch.watch")


def _gpus(m: dict[str, Any]) -> int:
    gpus = m.get("gpus")
    return gpus if isinstance(gpus, int) and gpus > 0 else 0


class ControllerCore:
    """The controller's state (what it has read, launched, decided, seen of the market) and its
    shared helpers; the parts of its pass are the subclasses in jobpass.py, outcomes.py and
    finishing.py."""

    def __init__(
        self,
        config: Config,
        store: Store,
        remote: Remote,
        provider: Provider,
        *,
        controller_id: str,
        clock: Callable[[], float] = time.time,
        say: Callable[[str], None] = lambda s: None,
        launcher: "Launcher | InlineLauncher | None" = None,
        keys: Optional[Keys] = None,
    ):
        assert config.recovery is not None
        self.config = config
        self.rc = config.recovery
        self.store = store
        self.remote = remote
        self.provider = provider
        self.controller_id = controller_id
        self.clock = clock
        self.say = say
        self.stale_after_s = config.storage.stale_after_minutes * 60
        self.launch_timeout_s = self.rc.launch_timeout_minutes * 60
        self.host = socket.gethostname()
        self._shown: dict[str, tuple[Any, ...]] = {}  # uid -> what the store last got
        # Provider calls run here; by default at once (tests, the benchmark's simulated clock).
        self.launcher = launcher or InlineLauncher()
        self.capacity_retry_s = self.rc.poll_seconds  # a capacity wait's next try: the next poll
        self._in_flight: dict[str, tuple[float, Group]] = {}  # launcher key -> (since, the group)
        self._placing: list[Placement] = []  # this pass's launches, placed together after it
        self._views: dict[str, JobView] = {}  # this pass's views, for outcomes that land in it
        # The market policy (policy.decide; the market benchmark passes its baselines here), what
        # this controller has seen of the spot market across its jobs, and the earliest moment a
        # decision of the last pass changes by itself (a simulated clock jumps there).
        self.policy: Callable[..., Decision] = decide
        self.market = dc.MarketView()
        # With [[recovery.zones]]: what was seen per zone and instance type, and each launch's zone.
        self.zones: Optional[zn.ZoneMarkets] = zn.ZoneMarkets(zn.zones_of(self.rc)) if self.rc.zones else None
        self.next_review: Optional[float] = None
        self._claims: dict[str, Any] = {}  # uid -> the claims as last listed and read (claims.read_claims)
        self._parsed: dict[str, tuple[bytes, dict[str, Any]]] = {}  # uid -> its manifest as last read
        self.reaction_s = self.stale_after_s + self.rc.poll_seconds
        self.alive_timeout_s = min(60.0, self.launch_timeout_s)  # a question: answered fast or "cannot tell"
        # Every machine this controller launched, and the stops of those no longer needed.
        self.ledger = Ledger(store, remote, controller_id, clock)
        self.stopper = Stopper(
            provider, self.launcher, self.ledger, clock, self._event, self.rc.poll_seconds, redact, say
        )
        self.book = MachineBook(self.ledger, self.stopper, self.launch_timeout_s)
        self._seen: dict[str, Seen] = {}  # this pass: uid -> what it saw of the job (machines.py)
        self._settled: set[str] = set()  # finished jobs this process has looked at once
        # Provider answers to "is this machine gone?": asked off the loop, used once, in the pass
        # they arrive for (each pass asks again), and the same machine asked once per pass.
        self._answers: dict[str, Optional[bool]] = {}
        self._pass_answers: dict[str, Optional[bool]] = {}
        self._later: list[Outcome] = []  # launch and stop outcomes seen mid-pass: recorded after it
        # Launches whose machine adopted before the launch command returned: (uid, n) -> the home.
        self._adopted_early: dict[tuple[str, int], str] = {}
        # What may be acted on at all: signed manifests (with `keys`), else only `orch launch`'s jobs.
        self.gate = TrustGate(store, keys)

    def _read(self, uid: str) -> Optional[tuple[dict[str, Any], Optional[str]]]:
        key = mf.manifest_key(uid)
        try:
            got = self.remote.get_with_etag(key, max_bytes=MAX_MANIFEST_BYTES)
        except TooLarge:
            return None
        if got is None:
            return None
        held = self._parsed.get(uid)
        if held is not None and held[0] == got[0]:
            return held[1], got[1]  # unchanged since the last pass: checked then
        try:
            m = parse_manifest(got[0], self.remote.where(key), uid)
        except ManifestError:
            return None
        self._parsed[uid] = (got[0], m)
        return m, got[1]

    # -- the market ---------------------------------------------------------------------------

    def _decide(self, m: dict[str, Any], claims: list[cl.Claim], current: str, losses: int) -> Decision:
        """The policy's answer for this job now (and when it would change by itself). The decision
        (next_action.py) notes its review and says an infeasible deadline where it reads it."""
        now = self.clock()
        started = float(m.get("submitted_at") or m.get("started_at") or m.get("written_at") or now)
        market, zone = self.market, None
        if self.zones is not None:  # spot wherever some zone has it, judged by that zone's own history
            gpus = _gpus(m)
            self.zones.note_claims(str(m.get("uid") or ""), claims, gpus)
            market, zone = self.zones.policy_view(now, self.capacity_retry_s, gpus)
        situation = dc.situation(
            m,
            now=now,
            started=started,
            deadline=deadline_of(m),
            current=current,
            losses=losses,
            market=market,
            rc=self.rc,
            pricing=self.config.pricing,
            reaction_s=self.reaction_s,
            retry_s=self.capacity_retry_s,
        )
        ratio = zone.price_ratio() if zone is not None else None
        if ratio is not None:  # the zone's own prices
            situation = dataclasses.replace(situation, price_ratio=ratio)
        decision = self.policy(situation)
        if self.zones is not None and decision.market in (SPOT, ON_DEMAND):
            chosen = self.zones.choose(decision.market, now, self.capacity_retry_s, _gpus(m))
            decision = dataclasses.replace(decision, zone=chosen.name if chosen else "")
        if situation.deadline is None and deadline_of(m) is not None:
            why = decision.why + " (no pace measured yet)"
            decision = Decision(decision.market, why, decision.review_at, infeasible_at=decision.infeasible_at)
        return decision

    def _review(self, at: Optional[float]) -> None:
        if at is not None and (self.next_review is None or at < self.next_review):
            self.next_review = at

    def pool_note(self) -> str:
        """A line when every provider-call worker is held by a call running longer than a poll
        (hung launch commands, a crawling cloud API): the calls after them wait for a worker."""
        held = self.launcher.held(max(self.rc.poll_seconds, 1.0))
        if not held:
            return ""
        calls = ", ".join(f"{key.split(',')[0][:60]} for {s:.0f} s" for key, s in held)
        waiting = self.launcher.waiting()
        return f"every provider-call worker is busy ({calls}): {waiting} more call(s) wait for one" + (
            "" if waiting else "; further launches, stops and alive questions will wait"
        )

    def in_flight(self) -> int:
        """Provider calls running now."""
        return len(self._in_flight)

    def _since(self, uid: str, n: int) -> Optional[float]:
        """When this controller's launch n of `uid` started, while the provider call runs."""
        for since, g in self._in_flight.values():
            if any(p.uid == uid and p.n == n for p in g.placements):
                return since
        return None

    # -- planned moves and stops --------------------------------------------------------------

    def ask_move(self, uid: str, to: str, why: str) -> moves.MoveRequest:
        """Ask, through the bucket, that the lease holder hand job `uid` over for market `to`
        (moving.py). Raises moving.MoveRefused (a finished job, no holder, a move under way)."""
        return mv.ask(self.store, self.remote, self.config, uid, to, why, by=self.controller_id, now=self.clock())

    # -- helpers ------------------------------------------------------------------------------

    def _gone(self, own: dict[str, Any]) -> "Optional[bool] | str":
        """Whether the machine a lease (or a launch) names is gone: True, False, None (cannot tell),
        or ASKING while the provider's answer is not in. A machine this controller launched is asked
        about by the id its launch returned (the `alive` command gets it)."""
        ask = dict(own)
        if not ask.get("instance_id"):
            known = self.book.home_machine(str(own.get("home_id") or ""))
            if known is not None:
                ask["instance_id"] = known.instance_id
        ident = str(ask.get("instance_id") or ask.get("home_id") or ask.get("host") or "")
        key = ALIVE_PREFIX + ident
        if key in self._pass_answers:
            return self._pass_answers[key]
        if key in self._answers:
            self._pass_answers[key] = self._answers.pop(key)
            return self._pass_answers[key]
        if self.launcher.since(key) is None:
            self.launcher.submit(key, lambda: self.provider.machine_gone(ask), timeout_s=self.alive_timeout_s)
            self._drain()
            if key in self._answers:  # answered at once (an inline launcher: tests, --once)
                self._pass_answers[key] = self._answers.pop(key)
                return self._pass_answers[key]
        return ASKING

    def _drain(self) -> None:
        """Take the finished provider calls: the alive answers now, the rest after the pass."""
        for outcome in self.launcher.finished():
            if not outcome.key.startswith(ALIVE_PREFIX):
                self._later.append(outcome)
                continue
            if outcome.error is not None:
                text = redact(str(outcome.error))
                log.warning("provider %s cannot tell whether %s runs: %s", self.provider.name, outcome.key[6:], text)
            value = outcome.value if outcome.error is None and outcome.value in (True, False) else None
            self._answers[outcome.key] = value

    def _cancel(self, claim: cl.Claim, why: str) -> None:
        claim.status, claim.error, claim.updated_at = cl.CANCELLED, why, self.clock()
        self._update(claim)

    def _update(self, claim: cl.Claim, *, retrying: bool = False) -> bool:
        """Write the claim, conditional on its ETag; False when another writer changed it first (said
        in words unless the caller re-reads and tries again)."""
        try:
            cl.update(self.remote, claim)
            return True
        except Conflict:
            if retrying:
                return False
            self.say(
                f"job {claim.uid[:12]}: launch {claim.n}'s record in the bucket was rewritten by someone else "
                "since this controller read it (another `orch watch` on this bucket, or the same one "
                "restarted); it is left as they wrote it"
            )
            return False

    def _event(self, key: str, kind: EventKind, m: dict[str, Any], detail: str) -> None:
        payload = {
            "event": kind.value,
            "job_name": str(m.get("name") or ""),
            "state": str(m.get("state") or ""),
            "reason": detail,
            "host": self.host,
        }
        if self.store.recovery_event(key, kind.value, detail, self.clock(), outgoing_for(self.config, kind, payload)):
            self.say(f"{kind.value}: {detail}")
