"""benchmarks/market.py --jobs-per-machine N: N jobs with different deadlines share one machine.

The jobs start together on one machine (a user's 4-GPU box running four fine-tunes) that is lost
as the replay begins, so the controller places them as it places any lost machine's jobs
(recovery/placing.py): together, one machine per (lost machine, market), a GPU per job. From then
on each job is decided alone -- a tight deadline may want on-demand while its neighbours wait for
spot -- and a machine's jobs are lost together when spot is reclaimed. The world is world.py's,
per job: a machine adopts the jobs its launch named, every adoption costs the job the hand-over,
a machine asked to move one job hands that one over and powers off once it holds none. A machine
is billed its hours times its GPUs (one per job it was launched for)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Optional

from orchestrator.model.markets import ON_DEMAND, SPOT
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore import moves
from orchestrator.recovery.controller import LEFT, Controller, launch_key
from orchestrator.recovery.launcher import InlineLauncher
from orchestrator.recovery.policy import Decision, Situation
from orchestrator.spec.config import Config
from orchestrator.store import Store

from .memory_remote import MemoryRemote
from .replay import EPOCH, PASSES_AT_ONCE, Clock
from .world import HEARTBEAT_S, Machine, Market

START_HOME = "home-start"  # the machine the jobs were submitted on, lost as the replay begins


@dataclass
class Box(Machine):
    uids: tuple[str, ...] = ()  # the jobs its launch named (it adopts only these)
    gpus: int = 1
    resumes: dict[str, float] = field(default_factory=dict)  # job -> when it makes progress (after the hand-over)

    def resume_at_of(self, uid: str) -> float:
        return self.resumes.get(uid, float("inf"))


@dataclass
class Job:
    uid: str
    total_s: float
    deadline: float
    done_s: float = 0.0
    finished_at: Optional[float] = None
    holder: Optional[Box] = None
    released: bool = False
    adopted: list[tuple[Box, float, float]] = field(default_factory=list)  # (machine, adopted at, work done then)
    work: dict[str, float] = field(default_factory=dict)  # market -> progress made on it

    def active_on(self, box: Box, t: float) -> bool:
        return self.holder is box and not self.released and self.finished_at is None and box.alive(t)


@dataclass
class PackedWorld:
    market: Market
    zones: dict[str, Market]
    jobs: dict[str, Job]
    remote: Any
    clock: Any
    changeover_s: float
    handover_s: float
    submitted_at: float
    t: float
    machines: dict[str, Box] = field(default_factory=dict)

    name = "simulated"
    can_stop = True

    # -- the provider (as world.World's, remembering the jobs and GPUs of each launch) ------------

    def launch(self, request: Any) -> Any:
        from orchestrator.recovery.provider import Launched, NoCapacity

        now = self.clock()
        if self.zones and request.zone not in self.zones:
            raise NoCapacity(f"simulated: no zone {request.zone!r}")
        if request.market == SPOT and not self._market(request.zone).available(now):
            raise NoCapacity(f"simulated: no spot capacity in zone {request.zone or 'of the trace'} now")
        box = Box(f"i-{len(self.machines) + 1:08x}", request.market, now, now + self.changeover_s)
        box.zone, box.uids, box.gpus = request.zone, tuple(request.job_uids), max(1, request.gpus or 1)
        self.machines[box.id] = box
        return Launched(box.id, f"{box.id} ({request.market})")

    def _market(self, zone: str) -> Market:
        return self.zones[zone] if self.zones else self.market

    def stop(self, instance_id: str) -> str:
        box = self.machines.get(instance_id)
        if box is not None and box.end_at is None:
            box.end_at = self.clock()
        return f"{instance_id} terminated"

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        box = self.machines.get(str(owner.get("instance_id") or ""))
        return None if box is None else not box.alive(self.clock())

    # -- time ---------------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return all(j.finished_at is not None for j in self.jobs.values())

    def advance(self, t: float) -> None:
        for box in self.machines.values():  # spot reclaims, as world.py
            if box.end_at is None and box.market == SPOT:
                market = self._market(box.zone)
                change = market.next_change(max(box.launched_at, self.t))
                if not market.available(max(box.launched_at, self.t)):
                    box.end_at = max(box.launched_at, self.t)
                elif change <= t:
                    box.end_at = change
        for job in self.jobs.values():
            h = job.holder
            if h is None or job.released or job.finished_at is not None:
                continue
            start, stop = max(self.t, h.resume_at_of(job.uid)), min(t, h.end_at if h.end_at is not None else t)
            if stop > start:
                step = min(stop - start, job.total_s - job.done_s)
                job.done_s += step
                job.work[h.market] = job.work.get(h.market, 0.0) + step
                if job.done_s >= job.total_s - 1e-6:
                    job.finished_at = start + step
        self.t = t
        for job in self.jobs.values():
            self._honour_move(job, t)
        for box in self.machines.values():  # a machine that held jobs and holds none now powers off
            if box.end_at is None and box.adopted and not any(j.active_on(box, t) for j in self.jobs.values()):
                ends = [j.finished_at for j in self.jobs.values() if j.holder is box and j.finished_at is not None]
                box.end_at = max([b for b in ends if b >= box.launched_at] or [t])
        if self.finished:
            for box in self.machines.values():
                if box.end_at is None:
                    box.end_at = max(max(j.finished_at or 0.0 for j in self.jobs.values()), box.launched_at)
            return
        for job in self.jobs.values():
            h = job.holder
            if job.finished_at is not None or (h is not None and not job.released and h.alive(t)):
                continue
            for box in sorted(self.machines.values(), key=lambda b: b.ready_at):
                if box is not h and job.uid in box.uids and box.alive(t) and box.ready_at <= t:
                    job.holder, job.released, box.adopted = box, False, True
                    box.resumes[job.uid] = t + self.handover_s
                    job.adopted.append((box, t, job.done_s))
                    break

    def _honour_move(self, job: Job, t: float) -> None:
        h = job.holder
        if h is None or job.released or job.finished_at is not None or not h.alive(t):
            return
        request = moves.read(self.remote, job.uid)
        if request is not None and request.status == moves.ASKED and request.from_home == h.home_id:
            job.released = True  # checkpoint, lease released; the machine goes once it holds no job

    def next_event(self, t: float, stale_after_s: float, launch_timeout_s: float) -> float:
        times = [market.next_change(t) for market in (self.zones.values() if self.zones else [self.market])]
        for box in self.machines.values():
            if box.end_at is None and box.ready_at > t:
                times.append(box.ready_at)
            if box.end_at is not None and box.adopted and box.end_at + stale_after_s + 1.0 > t:
                times.append(box.end_at + stale_after_s + 1.0)
            if not box.adopted and box.launched_at + launch_timeout_s + 1.0 > t:
                times.append(box.launched_at + launch_timeout_s + 1.0)
        for job in self.jobs.values():
            h = job.holder
            if h is None or not h.alive(t) or job.released or job.finished_at is not None:
                continue
            request = moves.read(self.remote, job.uid)
            if request is not None and request.status == moves.ASKED and request.from_home == h.home_id:
                times.append(t + HEARTBEAT_S)
            resume = h.resume_at_of(job.uid)
            times += [resume, resume + HEARTBEAT_S, max(t, resume) + job.total_s - job.done_s]
        later = [x for x in times if x > t + 1e-6]
        return min(later) if later else float("inf")

    def write_manifests(self) -> None:
        for job in self.jobs.values():
            self._write(job)

    def _write(self, job: Job) -> None:
        h = job.holder
        done = job.finished_at is not None
        m: dict[str, Any] = {
            "version": 1,
            "uid": job.uid,
            "name": "market-benchmark",
            "state": "succeeded" if done else ("running" if h and not job.released else "queued"),
            "gpus": 1,
            "spec": {
                "name": "market-benchmark",
                "command": ["true"],
                "deadline": datetime.fromtimestamp(job.deadline, timezone.utc).isoformat(),
            },
            "submitted_at": self.submitted_at,
            "progress": {"step": int(job.done_s), "total_steps": int(job.total_s)},
            "cost": {"run_seconds": float(int(job.done_s))},
            "written_at": self.t,
        }
        if h is None:  # the machine the jobs were submitted on, gone as the replay begins
            m["owner"] = {"host": "start", "home_id": START_HOME, "pid": 1, "by": "daemon", "heartbeat": 0.0}
        else:
            m["owner"] = {
                "host": h.id,
                "home_id": h.home_id,
                "pid": 1,
                "by": "daemon",
                "heartbeat": self.t if h.alive(self.t) else h.end_at,
                "released": job.released,
                "instance_id": h.id,
            }
            held = job.adopted[-20:]

            def held_until(i: int) -> list[float]:
                return [held[i + 1][1]] if i + 1 < len(held) else []

            m["machines"] = [
                {
                    "home_id": box.home_id,
                    "market": box.market,
                    "from": since,
                    # until it handed the job on (the next machine's adoption), not while it
                    # runs the other jobs it holds
                    "to": min(self.t, box.end_at if box.end_at is not None else self.t, *held_until(i)),
                    "first_step": int(first),
                    "last_step": int(held[i + 1][2] if i + 1 < len(held) else job.done_s),
                }
                for i, (box, since, first) in enumerate(held)
            ]
        self.remote.put_bytes(mf.manifest_key(job.uid), json.dumps(m, separators=(",", ":")).encode())


@dataclass
class PackedResult:
    jobs: list[Job]
    world: PackedWorld
    given_up: bool

    def gpu_hours(self, market: str) -> float:
        return sum(
            (float(b.end_at or b.launched_at) - b.launched_at) / 3600 * b.gpus
            for b in self.world.machines.values()
            if b.market == market
        )

    def rows(self, trace: str, start: int, cost_of: Callable[[Box], float]) -> list[tuple[Any, ...]]:
        """One row per job in market.py's shape, each carrying the machines' hours shared equally."""
        n = len(self.jobs)
        od, spot = self.gpu_hours(ON_DEMAND) / n, self.gpu_hours(SPOT) / n
        cost = sum(cost_of(b) * b.gpus for b in self.world.machines.values()) / n
        out = []
        for j in self.jobs:
            missed = j.finished_at is None or j.finished_at > j.deadline + 1e-6
            out.append(
                (
                    trace,
                    start,
                    od,
                    spot,
                    j.work.get(ON_DEMAND, 0.0) / 3600,
                    j.work.get(SPOT, 0.0) / 3600,
                    missed,
                    self.given_up,
                    len(self.world.machines) / n,
                    cost,
                )
            )
        return out


def deadlines_h(job_h: float, deadline_h: float, n: int) -> list[float]:
    """N different deadlines: the slack (deadline - work) spread evenly, the last job's the full
    --deadline-hours, the first's 1/N of its slack."""
    return [job_h + (deadline_h - job_h) * (i + 1) / n for i in range(n)]


def replay_packed(
    values: "list[int] | dict[str, list[int]]",
    gap_s: float,
    start_tick: int,
    policy: Callable[[Situation], Decision],
    *,
    config: Config,
    store: Store,
    job_h: float,
    deadlines: list[float],
    seen: Optional[dict[Any, Any]] = None,
    handover_h: float = 0.0,
) -> PackedResult:
    """replay.replay for N jobs that start on one machine (lost at once); `deadlines` in hours
    after the start, one per job."""
    zone_values = values if isinstance(values, dict) else {}
    market = Market(next(iter(zone_values.values())) if zone_values else values, gap_s, EPOCH)  # type: ignore[arg-type]
    t0 = EPOCH + start_tick * gap_s
    clock = Clock(t0)
    remote = MemoryRemote()
    rc = config.recovery
    assert rc is not None
    jobs = {
        f"{start_tick:028x}{i:04x}": Job(f"{start_tick:028x}{i:04x}", job_h * 3600, t0 + d * 3600)
        for i, d in enumerate(deadlines)
    }
    world = PackedWorld(
        market=market,
        zones={zone: Market(v, gap_s, EPOCH) for zone, v in zone_values.items()},
        jobs=jobs,
        remote=remote,
        clock=clock,
        changeover_s=rc.changeover_minutes * 60,
        handover_s=handover_h * 3600,
        submitted_at=t0,
        t=t0,
    )
    controller = Controller(
        config,
        store,
        remote,  # type: ignore[arg-type]
        world,
        controller_id="benchmark",
        clock=clock,
        launcher=InlineLauncher(),
        policy=policy,
    )
    if seen is not None:  # one trace per zone whatever the machine's size: one history
        for gpus in range(1, len(jobs) + 1):
            controller.share_lifetimes(seen, gpus=gpus)
    for uid in jobs:  # `orch launch` put them in the bucket (from the machine they start on)
        store.recovery_mark(launch_key(uid), t0)
    stale_s, timeout_s = config.storage.stale_after_minutes * 60, rc.launch_timeout_minutes * 60
    given_up = False
    end = min(m.end() for m in world.zones.values()) if world.zones else market.end()
    world.write_manifests()
    while not world.finished and clock.t < end:
        for _ in range(PASSES_AT_ONCE):
            before = dict(remote.objects)
            if any(v.state == LEFT for v in controller.pass_once()):
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
        clock.t = end if later == float("inf") else later
        world.advance(clock.t)
        world.write_manifests()
    world.advance(clock.t)
    for box in world.machines.values():
        if box.end_at is None:
            box.end_at = clock.t
    return PackedResult(list(jobs.values()), world, given_up)
