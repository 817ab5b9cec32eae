"""`orch watch`: one pass over the mirror's jobs, and the loop that repeats it.

For each unfinished job whose owner lease has been silent longer than [storage]
stale_after_minutes and was not released, the controller
  1. asks the provider whether the old machine is gone (False: leave it; None/True: go on),
  2. queues `machine_lost` (once per lapsed lease),
  3. refuses past `max_launches` or what `max_cost` can pay for (one `relaunch_failed`),
  4. chooses the market (policy.py, decider.py),
  5. claims launch n in the mirror, create-only (claims.py), BEFORE calling the provider,
  6. reads the manifest again: a lease that came back to life cancels the claim,
  7. calls the provider off the loop (launcher.py), the jobs one lost machine held together on one
     machine (placing.py): `relaunched`; `capacity_wait` when the market has no capacity (the job
     waits, free; the claim is reused, not counted toward max_launches); or `relaunch_failed` and
     a backoff before the next claim.
A claim that did not lead to an adoption within `launch_timeout_minutes` (the controller died
mid-launch, or the machine never came up) is followed by the next claim, and its machine is
stopped. Every machine launched is in the ledger (ledger.py, machines.py) until it is stopped.
The controller never runs a job.

Its parts, held here (no part inherits another): the fact gatherer (gathering.py: the mirror's
manifests and claims, the provider's answers, the policy's through decider.py), the decision
(next_action.py, pure), the executor of its actions (executor.py), the launches and their outcomes
(outcomes.py), the machine ledger, its accounting and the stops (ledger.py, machines.py,
stopping.py), the verify gate (trust.py) and the events (reporting.py)."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..objectstore import claims as cl
from ..objectstore import moves
from ..objectstore.remote import Remote, StorageError
from ..objectstore.signing import Keys
from ..redaction import redact
from ..spec.config import Config
from ..store import Store
from . import actions as ac
from . import moving as mv
from .decider import Decider, Policy
from .executor import ClaimWriter, Executor
from .gathering import Gatherer
from .jobview import (
    ALIVE,
    DONE,
    LAUNCHING,
    LEFT,
    RELEASED,
    UNFINISHED,
    UNREADABLE,
    UNTRUSTED,
    WAITING,
    JobView,
    launch_key,
)
from .launcher import InlineLauncher, Launcher
from .ledger import Ledger
from .machines import MachineBook
from .next_action import next_action
from .outcomes import Launches
from .policy import decide
from .provider import Provider
from .reporting import Events
from .stopping import Stopper
from .trust import TrustGate

__all__ = [
    "ALIVE",
    "DONE",
    "LAUNCHING",
    "LEFT",
    "RELEASED",
    "UNREADABLE",
    "UNTRUSTED",
    "WAITING",
    "Controller",
    "JobView",
    "launch_key",
]

MAX_QUESTIONS = 12  # facts one decision may ask for (each once: a decision asks a few)
ALIVE_BOUND_S = 60.0  # "is it gone?" is a question: answered fast or "cannot tell"
STOP_BOUND_S = 600.0  # a stop call's bound (the stop is tried again with backoff past it)


class Controller:
    """`orch watch`'s controller: one pass over the mirror's jobs (pass_once). Per job: the facts
    gathered, the decision made (next_action), its actions performed; after the pass, the launches
    placed and the machine ledger's accounting (what is no longer needed is stopped).

    `policy`: the market policy (policy.decide; the market benchmark passes its baselines)."""

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
        policy: Policy = decide,
    ):
        assert config.recovery is not None
        self.config, self.rc, self.store, self.remote, self.provider = config, config.recovery, store, remote, provider
        self.controller_id, self.clock, self.say = controller_id, clock, say
        launch_timeout_s = self.rc.launch_timeout_minutes * 60
        # Provider calls run here; by default at once (tests, the benchmark's simulated clock).
        self.launcher = launcher or InlineLauncher()
        self.next_review: Optional[float] = None  # the earliest moment a decision of the last pass changes
        self._shown: dict[str, tuple[Any, ...]] = {}  # uid -> what the store last got
        self.events = Events(config, store, clock, say)
        self.writer = ClaimWriter(remote, clock, say)
        # Every machine this controller launched, and the stops of those no longer needed.
        self.ledger = Ledger(store, remote, controller_id, clock)
        self.stopper = Stopper(
            provider,
            self.launcher,
            self.ledger,
            clock,
            self.events.report,
            self.rc.poll_seconds,
            redact,
            say,
            timeout_s=min(STOP_BOUND_S, launch_timeout_s),
        )
        self.book = MachineBook(self.ledger, self.stopper, launch_timeout_s)
        # What may be acted on at all: signed manifests (with `keys`), else only `orch launch`'s jobs.
        self.gate = TrustGate(store, keys)
        self.decider = Decider(config, clock, policy, provider)
        self.gatherer = Gatherer(
            remote,
            store,
            provider,
            self.launcher,
            self.gate,
            self.decider,
            self.book,
            self.stopper,
            min(ALIVE_BOUND_S, launch_timeout_s),
        )
        self.launches = Launches(
            config=config,
            remote=remote,
            provider=provider,
            launcher=self.launcher,
            clock=clock,
            controller_id=controller_id,
            decider=self.decider,
            gatherer=self.gatherer,
            writer=self.writer,
            events=self.events,
            ledger=self.ledger,
            stopper=self.stopper,
        )
        self.executor = Executor(
            remote=remote,
            store=store,
            clock=clock,
            controller_id=controller_id,
            writer=self.writer,
            events=self.events,
            ledger=self.ledger,
            book=self.book,
            stopper=self.stopper,
            read_claims=self.gatherer.claims,
            ask_move=self.ask_move,
            review=self._review,
            placing=self.launches.placing,
            adopted_early=self.launches.adopted_early,
        )
        self.market, self.zones = self.decider.market, self.decider.zones  # what it has seen of the market

    # -- the benchmark's seam ---------------------------------------------------------------------

    def share_lifetimes(self, seen: dict[Any, Any], gpus: int = 1) -> None:
        """Spot lifetimes seen by other controllers of the same market (decider.share_lifetimes)."""
        self.decider.share_lifetimes(seen, gpus)

    # -- one pass ---------------------------------------------------------------------------------

    def pass_once(self) -> list[JobView]:
        """Look at every job in the mirror once; launch where a lease lapsed. Raises StorageError
        when the mirror cannot be listed (the loop retries at the next poll)."""
        views = []
        self.launches.collect()
        self.launches.placing.clear()
        self.launches.views, self.executor.seen, self.gatherer.pass_answers = {}, {}, {}
        self.next_review = None
        for uid in sorted(self.remote.list_dirs("jobs")):
            try:
                view = self._job(uid)
            except StorageError as exc:  # one job's objects unreadable now: the others still go
                view = JobView(uid, "", UNREADABLE, f"cannot read the mirror: {exc}")
            if view is None:
                continue
            views.append(view)
            self.launches.views[uid] = view
        self.launches.place()
        self.book.account(self.executor.seen, self.clock())  # stop what is no longer needed
        self.launches.collect()
        self.ledger.note = self.pool_note()
        self.ledger.flush()
        for view in views:
            self._show(view)
        return views

    def _job(self, uid: str) -> Optional[JobView]:
        """One job: the facts gathered, the decision made (asking for facts as it goes), its
        actions performed."""
        read = self.gatherer.manifest(uid)
        if read is None:
            return None
        m, raw = read
        facts = self.gatherer.facts(uid, raw, self._rules(), self.launches.since(uid))
        claims: list[cl.Claim] = []
        if facts.untrusted is None and m.get("state") in UNFINISHED:
            claims = self.gatherer.claims(uid)
            self.executor.enter_launches(claims)
            self.decider.note_claims(uid, claims)
        now = self.clock()
        for _ in range(MAX_QUESTIONS):
            plan = next_action(m, claims, facts, now)
            if plan.need is None:
                break
            facts = self.gatherer.answer(m, facts, plan.need)
        else:
            raise AssertionError(f"job {uid}: the decision kept asking ({plan.need})")
        assert plan.view is not None
        self.executor.run(uid, m, plan, plan.view)
        return plan.view

    def _rules(self) -> ac.Rules:
        return ac.Rules(
            stale_after_s=self.config.storage.stale_after_minutes * 60,
            launch_timeout_s=self.rc.launch_timeout_minutes * 60,
            capacity_retry_s=self.decider.retry_s,
            poll_s=self.rc.poll_seconds,
            max_launches=self.rc.max_launches,
            changeover_s=self.rc.changeover_minutes * 60,
            provider=self.provider.name,
            pricing=self.config.pricing,
            zoned=self.decider.zones is not None,
            can_stop=self.stopper.can_stop,
        )

    def _show(self, view: JobView) -> None:
        """The job's row in this controller's store (`orch status`), written when it changed."""
        shown = (view.name, view.state, view.waiting_since, view.launches, view.losses, view.market, view.note)
        if self._shown.get(view.uid) == shown:
            return  # nothing new: no write
        self._shown[view.uid] = shown
        self.store.recovery_set(
            view.uid,
            self.clock(),
            name=view.name,
            url=self.remote.url.raw,
            state=view.state,
            waiting_since=view.waiting_since,
            launches=view.launches,
            losses=view.losses,
            market=view.market,
            note=view.note,
        )

    def _review(self, at: float) -> None:
        if self.next_review is None or at < self.next_review:
            self.next_review = at

    # -- what `orch watch` and `orch status` ask ---------------------------------------------------

    def in_flight(self) -> int:
        """Provider calls running now."""
        return len(self.launches.in_flight)

    def pool_note(self) -> str:
        """A line when every provider-call worker is held by a call running longer than a poll
        (hung launch commands, a crawling cloud API, calls past their bound that a thread cannot
        be made to leave): the calls after them wait for a worker."""
        held = self.launcher.held(max(self.rc.poll_seconds, 1.0))
        if not held:
            return ""
        calls = ", ".join(f"{key} for {s:.0f} s" for key, s in held)
        waiting = self.launcher.waiting()
        return f"every provider-call worker is busy ({calls}): {waiting} more call(s) wait for one" + (
            "" if waiting else "; further launches, stops and alive questions will wait"
        )

    def ask_move(self, uid: str, to: str, why: str) -> moves.MoveRequest:
        """Ask, through the bucket, that the lease holder hand job `uid` over for market `to`
        (moving.py). Raises moving.MoveRefused (a finished job, no holder, a move under way)."""
        return mv.ask(self.store, self.remote, self.config, uid, to, why, by=self.controller_id, now=self.clock())

    def _cancel(self, claim: cl.Claim, why: str) -> None:
        self.writer.cancel(claim, why)
