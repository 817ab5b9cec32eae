"""Many markets: with `[[recovery.zones]]` a market is a (zone, market) pair. The policy
(policy.py) chooses spot, on-demand or idle as for one market, seeing spot wherever some zone has
it; this module keeps what the controller has seen per zone and instance type (refusals, spot
lifetimes: never mixed) and chooses the zone of each launch:

- spot: among the zones whose spot is believed available, the one whose spot has been up
  longest (seen unavailable longest ago: the traces' spells are heavy-tailed, an old one lives
  on), then the cheaper, then the first in the config;
- on-demand: the cheapest zone whose on-demand was not refused lately, then the first;
- a zone refused for capacity is not tried again before the next retry: the next launch goes to
  another zone at once, and the refused one is tried again later, never waited on.

Not yet: a move out of the bucket's region should pay the checkpoint's transfer (egress and
time); zones are treated as one region's.

Without zones the controller keeps its one MarketView (deciding.py) and none of this runs. Pure
but for the views it keeps, fed from the launch claims every pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..model.markets import ON_DEMAND, SPOT
from ..objectstore import claims as cl
from .deciding import MarketView

ZONE_KEY = "zone"  # the launch claim's extra field naming its zone


@dataclass(frozen=True)
class Zone:
    name: str
    spot_price: Optional[float] = None  # per hour; None: [pricing]
    on_demand_price: Optional[float] = None
    region: str = ""

    def price_ratio(self) -> Optional[float]:
        if self.spot_price and self.on_demand_price:
            return max(self.on_demand_price / self.spot_price, 1.0)
        return None

    def price(self, market: str) -> Optional[float]:
        return self.on_demand_price if market == ON_DEMAND else self.spot_price


def zones_of(rc: Any) -> list[Zone]:
    """[[recovery.zones]] as Zones (empty: one market, as without zones)."""
    return [Zone(z.name, z.spot_price, z.on_demand_price, z.region or "") for z in getattr(rc, "zones", None) or []]


def zone_of(claim: cl.Claim) -> str:
    return str(claim.extra.get(ZONE_KEY) or "")


@dataclass
class ZoneMarkets:
    """One MarketView per (zone, instance type); an instance type is the machine's GPU count here
    (one launch template or command per zone: the GPUs are what varies)."""

    zones: list[Zone]
    views: dict[tuple[str, int], MarketView] = field(default_factory=dict)
    od_refused: dict[tuple[str, int], float] = field(default_factory=dict)  # on-demand refusals, newest

    def view(self, zone: str, gpus: int) -> MarketView:
        return self.views.setdefault((zone, gpus), MarketView())

    def named(self, name: str) -> Optional[Zone]:
        return next((z for z in self.zones if z.name == name), None)

    def note_claims(self, uid: str, claims: list[cl.Claim], gpus: int) -> None:
        """Route each claim to its zone's view: the refusals and launches, and each spot lifetime
        (the machine's claim and the next one, which says when it was lost) to the zone it lived in."""
        for zone in {zone_of(c) for c in claims if zone_of(c)}:
            mine = [
                c if zone_of(c) == zone else _blank(c)  # others' claims only say when a machine was lost
                for c in claims
            ]
            self.view(zone, gpus).note_claims(uid, mine)
        for c in claims:
            if c.market == ON_DEMAND and c.status == cl.NO_CAPACITY and zone_of(c):
                key = (zone_of(c), gpus)
                self.od_refused[key] = max(self.od_refused.get(key, 0.0), c.updated_at)
            elif c.market == ON_DEMAND and c.status == cl.LAUNCHED and zone_of(c):
                if self.od_refused.get((zone_of(c), gpus), 0.0) <= c.updated_at:
                    self.od_refused.pop((zone_of(c), gpus), None)

    def spot_zones(self, now: float, retry_s: float, gpus: int) -> list[Zone]:
        """The zones whose spot is believed available, best first: up longest, cheaper, config order."""
        up = [z for z in self.zones if self.view(z.name, gpus).spot_now(now, retry_s)]

        def key(z: Zone) -> tuple[float, float]:
            down = self.view(z.name, gpus).seen(now).down_at
            return (down if down is not None else float("-inf"), z.spot_price or 0.0)

        return sorted(up, key=lambda z: (key(z), self.zones.index(z)))

    def choose(self, market: str, now: float, retry_s: float, gpus: int) -> Optional[Zone]:
        """The zone for a launch on `market`; None for spot when no zone has it."""
        if market == SPOT:
            best = self.spot_zones(now, retry_s, gpus)
            return best[0] if best else None
        fresh = [z for z in self.zones if now - self.od_refused.get((z.name, gpus), float("-inf")) >= retry_s]
        pool = fresh or self.zones  # every zone refused lately: the longest refused first
        if not fresh:
            return min(pool, key=lambda z: self.od_refused.get((z.name, gpus), 0.0))
        return min(pool, key=lambda z: (z.on_demand_price or 0.0, self.zones.index(z)))

    def policy_view(self, now: float, retry_s: float, gpus: int) -> tuple[MarketView, Optional[Zone]]:
        """The view the policy judges spot by: the best zone with spot; with none, the zone refused
        longest (its wait is the job's wait for spot), else the first."""
        best = self.spot_zones(now, retry_s, gpus)
        if best:
            return self.view(best[0].name, gpus), best[0]

        def since(z: Zone) -> float:
            w = self.view(z.name, gpus).waiting_since()
            return w if w is not None else float("inf")

        zone = min(self.zones, key=since)
        return self.view(zone.name, gpus), zone


def _blank(c: cl.Claim) -> cl.Claim:
    """A claim of another zone as seen from this one: it may say that this zone's machine was
    lost (its `lost` record), but it is neither a launch nor a refusal here."""
    return cl.Claim(c.uid, c.n, cl.CANCELLED, "", c.lost, c.claimed_at, c.controller, c.updated_at, extra=c.extra)
