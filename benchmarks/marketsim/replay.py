"""One job replayed through the real recovery controller (orchestrator.recovery.controller): its
pass loop, claims, market view and policy, against the simulated world of world.py, on a clock
that jumps from one event to the next (a trace change, a machine coming up or lost, the job's end,
the moment the policy said its answer would change) instead of polling every 30 s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from orchestrator.recovery.controller import LEFT, Controller, launch_key
from orchestrator.recovery.launcher import InlineLauncher
from orchestrator.recovery.policy import Decision, Situation
from orchestrator.spec.config import Config
from orchestrator.store import Store

from .memory_remote import MemoryRemote
from .world import Market, World

EPOCH = 1_700_000_000.0  # the trace's first tick, as Unix time (any will do: deadlines are ISO text)
PASSES_AT_ONCE = 4  # a pass that changed the bucket is followed by another at the same moment


@dataclass
class Result:
    od_h: float  # billed on-demand machine hours
    spot_h: float  # billed spot machine hours
    od_work_h: float  # progress made on on-demand (the paper's accounting)
    spot_work_h: float
    missed: bool
    given_up: bool
    machines: int
    world: Any = None  # the replay's world (its bucket, machines), for tests


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def sim_config(
    *,
    changeover_h: float,
    price_ratio: float = 3.14,
    stale_after_minutes: float = 1.0,
    poll_seconds: float = 30.0,
    zones: Optional[dict[str, tuple[float, float]]] = None,
) -> Config:
    """`zones`: name -> (spot price, on-demand price) per hour, one [[recovery.zones]] entry each."""
    return Config.model_validate(
        {
            "storage": {"url": "s3://market-benchmark/orch", "stale_after_minutes": stale_after_minutes},
            "recovery": {
                "provider": "command",
                "launch": ["true"],
                "poll_seconds": poll_seconds,
                "changeover_minutes": changeover_h * 60,
                # a launched machine has the changeover to come up, and some more
                "launch_timeout_minutes": max(20.0, changeover_h * 60 * 2),
                "zones": [
                    {"name": name, "spot_price": spot, "on_demand_price": od}
                    for name, (spot, od) in (zones or {}).items()
                ],
            },
            "pricing": {"gpu_hour": 1.0, "on_demand_gpu_hour": price_ratio},  # what the policy's ratio reads
        }
    )


def replay(
    values: "list[int] | dict[str, list[int]]",
    gap_s: float,
    start_tick: int,
    policy: Callable[[Situation], Decision],
    *,
    config: Config,
    store: Store,
    job_h: float,
    deadline_h: Optional[float],
    seen: Optional[dict[Any, Any]] = None,
    handover_h: float = 0.0,
) -> Result:
    """`seen`: the spot lifetimes observed by the controllers of this trace's earlier replays, kept
    across them (a controller watches one market for weeks, over many jobs); each replay's
    controller sees only those that ended before its own clock. `handover_h`: what every adoption
    costs the job (world.py), billed, no progress. With zones (`values` a trace per zone, and the
    config's [[recovery.zones]] naming them), `seen` is per zone."""
    zone_values = values if isinstance(values, dict) else {}
    market = Market(next(iter(zone_values.values())) if zone_values else values, gap_s, EPOCH)  # type: ignore[arg-type]
    t0 = EPOCH + start_tick * gap_s
    clock = Clock(t0)
    remote = MemoryRemote()
    rc = config.recovery
    assert rc is not None
    uid = f"{start_tick:032x}"
    world = World(
        market=market,
        uid=uid,
        remote=remote,
        clock=clock,
        total_s=job_h * 3600,
        changeover_s=rc.changeover_minutes * 60,
        handover_s=handover_h * 3600,
        zones={zone: Market(v, gap_s, EPOCH) for zone, v in zone_values.items()},
        submitted_at=t0,
        deadline=None if deadline_h is None else t0 + deadline_h * 3600,
        t=t0,
    )
    controller = Controller(
        config,
        store,
        remote,  # type: ignore[arg-type]
        world,  # type: ignore[arg-type]
        controller_id="benchmark",
        clock=clock,
        launcher=InlineLauncher(),
        policy=policy,
    )
    if seen is not None:  # per zone with zones; instance type: the job's one GPU
        controller.share_lifetimes(seen, gpus=1)
    store.recovery_mark(launch_key(uid), t0)  # `orch launch` put the job in the bucket
    stale_s, timeout_s = config.storage.stale_after_minutes * 60, rc.launch_timeout_minutes * 60
    given_up = False
    end = min(m.end() for m in world.zones.values()) if world.zones else market.end()
    world.write_manifest()
    while world.finished_at is None and clock.t < end:
        for _ in range(PASSES_AT_ONCE):
            before = dict(remote.objects)
            views = controller.pass_once()
            if any(v.state == LEFT for v in views):
                given_up = True
            if remote.objects == before:
                break
        if given_up:
            break
        later = world.next_event(clock.t, stale_s, timeout_s)
        if controller.next_review is not None and controller.next_review > clock.t:
            later = min(later, controller.next_review + 1.0)
        elif controller.next_review is not None:  # "now" (a capacity wait's next try): the next poll
            later = min(later, clock.t + rc.poll_seconds)
        if later == float("inf"):
            later = end
        clock.t = later
        world.advance(clock.t)
        world.write_manifest()
    world.advance(clock.t)
    finished = world.finished_at
    for m in world.machines.values():
        if m.end_at is None:
            m.end_at = clock.t
    od = [m for m in world.machines.values() if m.market == "on-demand"]
    spot = [m for m in world.machines.values() if m.market == "spot"]
    return Result(
        od_h=sum(m.end_at - m.launched_at for m in od) / 3600,  # type: ignore[operator]
        spot_h=sum(m.end_at - m.launched_at for m in spot) / 3600,  # type: ignore[operator]
        od_work_h=sum(m.work_s for m in od) / 3600,
        spot_work_h=sum(m.work_s for m in spot) / 3600,
        missed=world.deadline is not None and (finished is None or finished > world.deadline + 1e-6),
        given_up=given_up,
        machines=len(world.machines),
        world=world,
    )


def open_store(folder: Path) -> Store:
    return Store(folder / "orch.db")
