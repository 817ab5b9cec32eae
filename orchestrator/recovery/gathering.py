"""What the decision (next_action.py) reads, gathered: a job's manifest and claims from the mirror
(each read again only when its bytes or ETags changed), what the verify gate says of it, the
launches in flight, and each fact the decision asks for -- a provider's answer to "is machine X
gone?" (asked off the loop through the launcher, with its own short bound, once per machine per
pass; an answer that errs is logged with its code and counts as "cannot tell"), the policy's answer
(decider.py), the planned move under way, what a stop would say."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from ..objectstore import claims as cl
from ..objectstore import manifest as mf
from ..objectstore.manifest_model import MAX_MANIFEST_BYTES, ManifestError
from ..objectstore.manifest_model import parse as parse_manifest
from ..objectstore.remote import Remote, TooLarge
from ..objectstore.signing import content_id
from ..redaction import redact
from . import actions as ac
from . import moving as mv
from .decider import Decider
from .launcher import InlineLauncher, Launcher, Outcome, error_code
from .machines import MachineBook
from .provider import Provider
from .stopping import Stopper
from .trust import TrustGate

ALIVE_PREFIX = "alive:"

log = logging.getLogger("orch.watch")


class Gatherer:
    def __init__(
        self,
        remote: Remote,
        store: Any,
        provider: Provider,
        launcher: "Launcher | InlineLauncher",
        gate: TrustGate,
        decider: Decider,
        book: MachineBook,
        stopper: Stopper,
        alive_timeout_s: float,
    ):
        self.remote, self.store, self.provider, self.launcher = remote, store, provider, launcher
        self.gate, self.decider, self.book, self.stopper = gate, decider, book, stopper
        self.alive_timeout_s = alive_timeout_s  # a question: answered fast or "cannot tell"
        self.claims_cache: dict[str, Any] = {}  # uid -> the claims as last listed and read (claims.read_claims)
        self._parsed: dict[str, tuple[bytes, dict[str, Any]]] = {}  # uid -> its manifest as last read
        # Provider answers to "is this machine gone?": asked off the loop, used once, in the pass
        # they arrive for (each pass asks again), and the same machine asked once per pass.
        self._answers: dict[str, Optional[bool]] = {}
        self.pass_answers: dict[str, Optional[bool]] = {}
        self.later: list[Outcome] = []  # launch and stop outcomes seen mid-pass: recorded after it

    # -- the mirror ---------------------------------------------------------------------------

    def manifest(self, uid: str) -> Optional[tuple[dict[str, Any], bytes]]:
        """Job `uid`'s manifest and its bytes; None when it is missing, too large or not one."""
        key = mf.manifest_key(uid)
        try:
            got = self.remote.get_with_etag(key, max_bytes=MAX_MANIFEST_BYTES)
        except TooLarge:
            return None
        if got is None:
            return None
        held = self._parsed.get(uid)
        if held is not None and held[0] == got[0]:
            return held[1], got[0]  # unchanged since the last pass: checked then
        try:
            m = parse_manifest(got[0], self.remote.where(key), uid)
        except ManifestError:
            return None
        self._parsed[uid] = (got[0], m)
        return m, got[0]

    def claims(self, uid: str) -> list[cl.Claim]:
        return cl.read_claims(self.remote, uid, self.claims_cache)

    def facts(self, uid: str, raw: bytes, rules: ac.Rules, in_flight: dict[int, float]) -> ac.Facts:
        problem = self.gate.problem(uid, raw)  # the verify gate: nothing acts on an untrusted manifest
        untrusted = content_id(raw) if problem else ""
        return ac.Facts(uid, rules, untrusted=problem, content_id=untrusted, in_flight=in_flight)

    # -- the facts a decision asks for ----------------------------------------------------------

    def answer(self, m: dict[str, Any], facts: ac.Facts, need: ac.Need) -> ac.Facts:
        if isinstance(need, ac.NeedGone):
            gone = {**facts.gone, ac.machine_key(need.machine): self.gone(dict(need.machine))}
            return dataclasses.replace(facts, gone=gone)
        if isinstance(need, ac.NeedDecision):
            decision = self.decider.decide(m, list(need.claims), need.current, need.losses)
            return dataclasses.replace(facts, decisions={**facts.decisions, (need.current, need.losses): decision})
        if isinstance(need, ac.NeedMove):
            return dataclasses.replace(facts, move_read=True, move=mv.under_way(self.store, self.remote, facts.uid))
        stops = {**facts.stops, need.instance: self.stopper.state_once_wanted(need.instance)}
        return dataclasses.replace(facts, stops=stops)

    def gone(self, own: dict[str, Any]) -> ac.Gone:
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
        if key in self.pass_answers:
            return self.pass_answers[key]
        if key in self._answers:
            self.pass_answers[key] = self._answers.pop(key)
            return self.pass_answers[key]
        if self.launcher.since(key) is None:
            self.launcher.submit(key, lambda: self.provider.machine_gone(ask), timeout_s=self.alive_timeout_s)
            self.drain()
            if key in self._answers:  # answered at once (an inline launcher: tests, --once)
                self.pass_answers[key] = self._answers.pop(key)
                return self.pass_answers[key]
        return ac.ASKING

    def drain(self) -> None:
        """Take the finished provider calls: the alive answers now, the rest after the pass."""
        for outcome in self.launcher.finished():
            if not outcome.key.startswith(ALIVE_PREFIX):
                self.later.append(outcome)
                continue
            if outcome.error is not None:
                log.warning(
                    "provider %s cannot tell whether %s runs (%s): %s",
                    self.provider.name,
                    outcome.key[len(ALIVE_PREFIX) :],
                    error_code(outcome.error),
                    redact(str(outcome.error)),
                )
            value = outcome.value if outcome.error is None and outcome.value in (True, False) else None
            self._answers[outcome.key] = value

    def take_later(self) -> list[Outcome]:
        """The launch and stop outcomes finished since the last look (drained first)."""
        self.drain()
        later, self.later = self.later, []
        return later
