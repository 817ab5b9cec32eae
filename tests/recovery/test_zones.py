"""recovery/zones.py, pure: each launch's zone from what the controller's claims say of each zone
(refusals, launches, spot lifetimes), learned per zone and instance type, never mixed."""

from __future__ import annotations

import pytest

from orchestrator.objectstore import claims as cl
from orchestrator.recovery.zones import Zone, ZoneMarkets

RETRY = 30.0
A, B, C = Zone("a", 1.0, 3.0), Zone("b", 0.9, 3.0), Zone("c", 1.0, 2.5)


def claim(n: int, status: str, market: str, zone: str, at: float, **extra: object) -> cl.Claim:
    return cl.Claim("u1", n, status, market, {}, at, "ctl", at, extra={"zone": zone, **extra})


def markets(*claims: cl.Claim, gpus: int = 1) -> ZoneMarkets:
    zm = ZoneMarkets([A, B, C])
    zm.note_claims("u1", list(claims), gpus)
    return zm


@pytest.mark.parametrize(
    "name, claims, market, now, zone",
    [
        ("nothing seen: spot in the cheapest", (), "spot", 100.0, "b"),
        (
            "b refused spot just now: the next cheapest, at once",
            (claim(1, cl.NO_CAPACITY, "spot", "b", 100.0),),
            "spot",
            100.0,
            "a",
        ),
        (
            "a refused too: c",
            (claim(1, cl.NO_CAPACITY, "spot", "b", 100.0), claim(2, cl.NO_CAPACITY, "spot", "a", 100.0)),
            "spot",
            100.0,
            "c",
        ),
        (
            "b refused a retry ago, a and c just now: b is tried again",
            (
                claim(1, cl.NO_CAPACITY, "spot", "b", 100.0),
                claim(2, cl.NO_CAPACITY, "spot", "a", 131.0),
                claim(3, cl.NO_CAPACITY, "spot", "c", 131.0),
            ),
            "spot",
            131.0,
            "b",
        ),
        (
            "b refused a retry ago: a, never seen down, comes first",
            (claim(1, cl.NO_CAPACITY, "spot", "b", 100.0),),
            "spot",
            131.0,
            "a",
        ),
        ("on-demand: the cheapest on-demand", (), "on-demand", 100.0, "c"),
        (
            "on-demand refused in c: the next zone at once",
            (claim(1, cl.NO_CAPACITY, "on-demand", "c", 100.0),),
            "on-demand",
            100.0,
            "a",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_zone_table(name, claims, market, now, zone):
    chosen = markets(*claims).choose(market, now, RETRY, 1)
    assert chosen is not None and chosen.name == zone, name


def test_spot_in_no_zone_is_none():
    refused = [claim(i, cl.NO_CAPACITY, "spot", z, 100.0) for i, z in enumerate("abc", 1)]
    assert markets(*refused).choose("spot", 100.0, RETRY, 1) is None


def test_spot_goes_where_it_has_been_up_longest():
    # b's spot machine was reclaimed at 500 (its lease's last heartbeat, read from the next claim);
    # a's spot was last seen down at 100 (a refusal, then a launch): a has been up longer.
    zm = markets(
        claim(1, cl.NO_CAPACITY, "spot", "a", 100.0),
        claim(1, cl.LAUNCHED, "spot", "b", 200.0),
        claim(2, cl.LAUNCHED, "spot", "a", 520.0),
    )
    zm.view("b", 1).lifetimes[("u1", 500.0)] = 300.0
    assert zm.choose("spot", 600.0, RETRY, 1).name == "c"  # never seen down at all: up longest
    zm.view("c", 1).note_refused(150.0, 150.0)
    zm.view("c", 1).note_launched(160.0)
    assert zm.choose("spot", 600.0, RETRY, 1).name == "a"  # down at 100 < c's 150 < b's 500


def test_lifetimes_are_learned_per_zone_and_instance_type():
    # A spot machine in zone a (launch 1) lost: launch 2 (zone b) records the lost lease's heartbeat.
    lost = cl.Claim("u1", 2, cl.LAUNCHED, "spot", {"heartbeat": 4000.0}, 4100.0, "ctl", 4100.0, extra={"zone": "b"})
    zm = markets(claim(1, cl.LAUNCHED, "spot", "a", 400.0), lost, gpus=4)
    assert zm.view("a", 4).seen(5000.0).lifetimes_s == (3600.0,)
    assert zm.view("b", 4).seen(5000.0).lifetimes_s == ()  # not mixed into the zone it moved to
    assert zm.view("a", 1).seen(5000.0).lifetimes_s == ()  # nor into another instance type


# Zones in two regions; the bucket in us-east-1.
EAST, WEST = Zone("east-a", 1.0, 3.0, "us-east-1"), Zone("west-a", 0.5, 2.0, "us-west-2")


def two_regions(*claims: cl.Claim, bucket: str = "us-east-1") -> ZoneMarkets:
    zm = ZoneMarkets([EAST, WEST], bucket_region=bucket, egress_per_gb=0.09)
    zm.note_claims("u1", list(claims), 1)
    return zm


def test_zones_of_the_buckets_region_come_first_though_dearer():
    zm = two_regions()
    assert zm.choose("spot", 100.0, RETRY, 1) == EAST
    assert zm.choose("on-demand", 100.0, RETRY, 1) == EAST
    assert zm.policy_view(100.0, RETRY, 1)[1] == EAST
    # The bucket's region refused: the far zone is the one left to judge (the policy weighs its transfer).
    refused = two_regions(
        claim(1, cl.NO_CAPACITY, "spot", "east-a", 100.0), claim(2, cl.NO_CAPACITY, "on-demand", "east-a", 100.0)
    )
    assert refused.choose("spot", 100.0, RETRY, 1) == WEST
    assert refused.policy_view(100.0, RETRY, 1)[1] == WEST
    assert refused.choose("on-demand", 100.0, RETRY, 1) == WEST
    # No bucket region said: every zone is near, the cheaper first as before.
    assert two_regions(bucket="").choose("spot", 100.0, RETRY, 1) == WEST


def test_a_far_zone_pays_the_checkpoints_transfer():
    m = {"gpus": 1, "checkpoints": [{"name": "step-9", "bytes": 2_000_000_000}, {"name": "step-5", "bytes": 1}]}
    zm = two_regions()
    # 2 GB at 50 MB/s: 40 s; 2 GB x 0.09 = 0.18 at 2.0 per hour on-demand: 324 s of on-demand.
    assert zm.crossing(WEST, m, None) == {"transfer_s": 40.0, "transfer_cost_s": pytest.approx(324.0)}
    assert zm.crossing(EAST, m, None) == {"transfer_s": 0.0, "transfer_cost_s": 0.0}
    assert zm.crossing(None, m, None) == {"transfer_s": 0.0, "transfer_cost_s": 0.0}
    assert two_regions(bucket="").crossing(WEST, m, None)["transfer_s"] == 0.0


def test_zone_markets_read_the_bucket_region_egress_and_bandwidth_from_the_config():
    from orchestrator.spec.config import Config

    config = Config.model_validate(
        {
            "storage": {"url": "s3://bucket/orch", "region": "us-east-1"},
            "pricing": {"egress_per_gb": 0.02},
            "recovery": {
                "provider": "aws",
                "cross_region_mb_per_second": 100,
                "aws": {"region": "us-east-1", "launch_template": "t"},
                "zones": [{"name": "east-a"}, {"name": "west-a", "region": "us-west-2"}],
            },
        }
    )
    zm = ZoneMarkets.of(config)
    assert [z.region for z in zm.zones] == ["us-east-1", "us-west-2"]  # a zone without one: [recovery.aws]'s
    assert (zm.bucket_region, zm.egress_per_gb, zm.cross_bytes_per_s) == ("us-east-1", 0.02, 100e6)
    assert [zm.far(z) for z in zm.zones] == [False, True]
