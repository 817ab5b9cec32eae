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

A zone outside the bucket's region ([storage] region; a zone's `region`, else [recovery.aws]'s)
pays the checkpoint's transfer on every launch there: its bytes x [pricing] egress_per_gb and its
time at [recovery] cross_region_mb_per_second (`crossing`, put into the policy's Situation). The
zones of the bucket's region rank first (they move for free): a far zone is judged only when no
near one has spot, and the policy takes it only when its saving outweighs the transfer;
on-demand goes to a far zone only when every near one was refused lately. A region left unsaid
(the zone's or the bucket's) counts as the bucket's.

Without zones the controller keeps its one MarketView (deciding.py) and none of this runs. Pure
but for the views it keeps, fed from the launch claims every pass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ..cost.money import Pricing
from ..model.markets import ON_DEMAND, SPOT
from ..objectstore import claims as cl
from .deciding import MarketView
from .policy import Situation

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
    bucket_region: str = ""  # [storage] region ("": every zone counts as the bucket's region's)
    egress_per_gb: float = 0.0  # [pricing] egress_per_gb
    cross_bytes_per_s: float = 50e6  # [recovery] cross_region_mb_per_second
    # A zone without spot_price: its price from the provider (aws: the spot price history), where it
    # can say; its on-demand price then from [pricing].
    spot_price_of: Optional[Callable[[str], Optional[float]]] = None
    pricing: Any = None

    @classmethod
    def of(cls, config: Any, provider: Any = None) -> "ZoneMarkets":
        rc = config.recovery
        aws_region = getattr(getattr(rc, "aws", None), "region", None) or ""
        zones = [dataclasses.replace(z, region=z.region or aws_region) for z in zones_of(rc)]
        return cls(
            zones,
            bucket_region=getattr(config.storage, "region", None) or "",
            egress_per_gb=float(getattr(config.pricing, "egress_per_gb", 0.0) or 0.0),
            cross_bytes_per_s=float(getattr(rc, "cross_region_mb_per_second", 50.0)) * 1e6,
            spot_price_of=getattr(provider, "spot_price", None),
            pricing=config.pricing,
        )

    def priced(self, zone: Zone, gpus: int) -> Zone:
        """The zone with its spot price from the provider when the config gives none (and then its
        on-demand price, if not given, from [pricing] on_demand_gpu_hour for `gpus`)."""
        if zone.spot_price is not None or self.spot_price_of is None:
            return zone
        spot = self.spot_price_of(zone.name)
        if spot is None or spot <= 0:
            return zone
        od = zone.on_demand_price
        if od is None and self.pricing is not None and getattr(self.pricing, "on_demand_gpu_hour", None) is not None:
            od = Pricing.of(self.pricing).machine_hour(gpus, ON_DEMAND)
        return dataclasses.replace(zone, spot_price=spot, on_demand_price=od)

    def far(self, zone: Zone) -> bool:
        """Outside the bucket's region: a launch there pays the checkpoint's transfer."""
        return bool(self.bucket_region and zone.region and zone.region != self.bucket_region)

    def with_crossing(
        self, situation: Situation, zone: Optional[Zone], m: Mapping[str, Any], pricing: Any
    ) -> Situation:
        """The policy's view of job `m` with `zone`'s transfer (nothing for the bucket's region)."""
        got = self.crossing(zone, m, pricing)
        return dataclasses.replace(situation, transfer_s=got["transfer_s"], transfer_cost_s=got["transfer_cost_s"])

    def crossing(self, zone: Optional[Zone], m: Mapping[str, Any], pricing: Any) -> dict[str, float]:
        """The policy's transfer_s and transfer_cost_s for job `m` launched in `zone`: its newest
        checkpoint's bytes at cross_bytes_per_s, and their egress as seconds of on-demand (the
        zone's on-demand price, else [pricing]'s for the job's GPUs). Nothing for a zone of the
        bucket's region."""
        if zone is None or not self.far(zone):
            return {"transfer_s": 0.0, "transfer_cost_s": 0.0}
        size = checkpoint_bytes(m)
        gpus = m.get("gpus") if isinstance(m.get("gpus"), int) else 0
        od_price_h = zone.on_demand_price or Pricing.of(pricing).machine_hour(int(gpus or 0), ON_DEMAND)
        money = size / 1e9 * self.egress_per_gb
        cost_s = money / od_price_h * 3600 if od_price_h > 0 else (float("inf") if money > 0 else 0.0)
        return {"transfer_s": size / self.cross_bytes_per_s, "transfer_cost_s": cost_s}

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
        up = [self.priced(z, gpus) for z in self.zones if self.view(z.name, gpus).spot_now(now, retry_s)]

        def key(z: Zone) -> tuple[bool, float, float]:
            down = self.view(z.name, gpus).seen(now).down_at
            return (self.far(z), down if down is not None else float("-inf"), z.spot_price or 0.0)

        order = [z.name for z in self.zones]
        return sorted(up, key=lambda z: (key(z), order.index(z.name)))

    def choose(self, market: str, now: float, retry_s: float, gpus: int) -> Optional[Zone]:
        """The zone for a launch on `market`; None for spot when no zone has it."""
        if market == SPOT:
            best = self.spot_zones(now, retry_s, gpus)
            return best[0] if best else None
        zones = [self.priced(z, gpus) for z in self.zones]
        fresh = [z for z in zones if now - self.od_refused.get((z.name, gpus), float("-inf")) >= retry_s]
        if not fresh:  # every zone refused lately: the longest refused first
            return min(zones, key=lambda z: (self.far(z), self.od_refused.get((z.name, gpus), 0.0)))
        return min(fresh, key=lambda z: (self.far(z), z.on_demand_price or 0.0, zones.index(z)))

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
        return self.view(zone.name, gpus), self.priced(zone, gpus)


def checkpoint_bytes(m: Mapping[str, Any]) -> float:
    """The size of the job's newest checkpoint in the bucket (its manifest's list is newest first)."""
    for rec in m.get("checkpoints") or []:
        size = rec.get("bytes") if isinstance(rec, dict) else None
        if isinstance(size, (int, float)) and size > 0:
            return float(size)
    return 0.0


def _blank(c: cl.Claim) -> cl.Claim:
    """A claim of another zone as seen from this one: it may say that this zone's machine was
    lost (its `lost` record), but it is neither a launch nor a refusal here."""
    return cl.Claim(c.uid, c.n, cl.CANCELLED, "", c.lost, c.claimed_at, c.controller, c.updated_at, extra=c.extra)
