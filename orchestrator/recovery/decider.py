"""The market policy's answer for one job, as the decision (next_action.py) asks for it: what this
controller has seen of the spot market (one MarketView, or one per zone and instance type with
[[recovery.zones]]) put into the policy's terms (deciding.py), the policy called (policy.decide,
or the market benchmark's baselines), and the zone of a launch chosen (zones.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from ..model.markets import ON_DEMAND, SPOT
from ..objectstore import claims as cl
from ..spec.config import Config
from . import deciding as dc
from . import zones as zn
from .jobview import deadline_of
from .policy import Decision, Situation, decide

Policy = Callable[[Situation], Decision]


def gpus_of(m: dict[str, Any]) -> int:
    gpus = m.get("gpus")
    return gpus if isinstance(gpus, int) and gpus > 0 else 0


class Decider:
    def __init__(self, config: Config, clock: Callable[[], float], policy: Policy = decide, provider: Any = None):
        assert config.recovery is not None
        self.config, self.rc, self.clock, self.policy = config, config.recovery, clock, policy
        self.retry_s = self.rc.poll_seconds  # a capacity wait's next try: the next poll
        self.reaction_s = config.storage.stale_after_minutes * 60 + self.rc.poll_seconds
        self.market = dc.MarketView()
        # With [[recovery.zones]]: what was seen per zone and instance type, and each launch's zone.
        self.zones: Optional[zn.ZoneMarkets] = zn.ZoneMarkets.of(config, provider) if self.rc.zones else None

    def share_lifetimes(self, seen: dict[Any, Any], gpus: int = 1) -> None:
        """Read and add to spot lifetimes kept outside this controller (the market benchmark's
        replays of one trace share them, as one controller watching a market for weeks would): with
        zones, `seen` holds one dict per zone, for machines of `gpus` GPUs."""
        if self.zones is None:
            self.market.lifetimes = seen
            return
        for zone in self.zones.zones:
            self.zones.view(zone.name, gpus).lifetimes = seen.setdefault(zone.name, {})

    def note_claims(self, uid: str, claims: list[cl.Claim]) -> None:
        self.market.note_claims(uid, claims)

    def decide(self, m: dict[str, Any], claims: list[cl.Claim], current: str, losses: int) -> Decision:
        """The policy's answer for this job now (and when it would change by itself). The decision
        notes its review and says an infeasible deadline where it reads it."""
        now = self.clock()
        started = float(m.get("submitted_at") or m.get("started_at") or m.get("written_at") or now)
        market, zone = self.market, None
        if self.zones is not None:  # spot wherever some zone has it, judged by that zone's own history
            gpus = gpus_of(m)
            self.zones.note_claims(str(m.get("uid") or ""), claims, gpus)
            market, zone = self.zones.policy_view(now, self.retry_s, gpus)
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
            retry_s=self.retry_s,
        )
        ratio = zone.price_ratio() if zone is not None else None
        if ratio is not None:  # the zone's own prices
            situation = dataclasses.replace(situation, price_ratio=ratio)
        if self.zones is not None:  # a zone outside the bucket's region: the checkpoint's transfer
            situation = self.zones.with_crossing(situation, zone, m, self.config.pricing)
        decision = self.policy(situation)
        if self.zones is not None and decision.market in (SPOT, ON_DEMAND):
            chosen = self.zones.choose(decision.market, now, self.retry_s, gpus_of(m))
            decision = dataclasses.replace(decision, zone=chosen.name if chosen else "")
        if situation.deadline is None and deadline_of(m) is not None:
            why = decision.why + " (no pace measured yet)"
            decision = Decision(decision.market, why, decision.review_at, infeasible_at=decision.infeasible_at)
        return decision
