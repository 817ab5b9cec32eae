"""The simulated cloud and machines of one replayed job. The spot market follows an availability
trace: a spot launch is refused (NoCapacity) while the trace says 0, and a spot machine is
reclaimed the moment it turns 0. A launched machine boots for the changeover (paid, no progress),
adopts the job as `orch adopt` + `orch daemon start` would and holds the lease; every adoption --
after a loss or a planned move alike -- then costs the job's hand-over (`handover_s`: the
checkpoint's download and the resume up to the first step; paid, no progress), after which the
machine makes progress at the job's pace and writes the manifest (heartbeat, progress,
run_seconds, its `machines` record) as its daemon does; a machine asked to move hands the job over
(checkpoint, released lease) and powers off, as does one whose job is done. Every machine's hours
are billed on its market from launch to its end. With `zones`, each zone has its own trace: a
launch goes to the zone its request names, and a spot machine lives by its zone's trace."""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

from orchestrator.model.markets import SPOT
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore import moves
from orchestrator.recovery.provider import Launched, LaunchRequest, NoCapacity

HEARTBEAT_S = 30.0  # a daemon reads its jobs' move requests at each heartbeat


@dataclass
class Machine:
    id: str
    market: str
    launched_at: float
    ready_at: float
    end_at: Optional[float] = None
    work_s: float = 0.0  # progress made on it
    adopted: bool = False  # it has held the job
    adopted_at: Optional[float] = None
    resume_at: float = 0.0  # adopted, it makes progress from then on (after the hand-over)
    first_work_s: float = 0.0  # the job's progress when it adopted
    zone: str = ""  # with zones: the zone it runs in (its spot market)

    @property
    def home_id(self) -> str:
        return f"home-{self.id}"

    def alive(self, t: float) -> bool:
        return self.end_at is None or self.end_at > t


class Market:
    """Spot availability from a trace: one value every `gap_s`, 1 = spot can be had."""

    def __init__(self, values: list[int], gap_s: float, epoch: float):
        self.values, self.gap_s, self.epoch = values, gap_s, epoch
        self.changes = [i for i in range(1, len(values)) if values[i] != values[i - 1]]

    def tick(self, t: float) -> int:
        return int((t - self.epoch) // self.gap_s)

    def available(self, t: float) -> bool:
        i = self.tick(t)
        return 0 <= i < len(self.values) and bool(self.values[i])

    def next_change(self, t: float) -> float:
        """The first moment after t when availability changes (inf when it never does again)."""
        j = bisect.bisect_right(self.changes, self.tick(t))
        return self.epoch + self.changes[j] * self.gap_s if j < len(self.changes) else float("inf")

    def end(self) -> float:
        return self.epoch + len(self.values) * self.gap_s


@dataclass
class World:
    market: Market
    uid: str  # the job's
    remote: Any
    clock: Any
    total_s: float
    changeover_s: float
    submitted_at: float
    deadline: Optional[float]
    handover_s: float = 0.0
    machines: dict[str, Machine] = field(default_factory=dict)
    holder: Optional[Machine] = None  # the machine holding the lease
    released: bool = False  # the holder handed the job over (a planned move)
    done_s: float = 0.0
    finished_at: Optional[float] = None
    t: float = 0.0
    zones: dict[str, Market] = field(default_factory=dict)  # with zones: each zone's spot market
    adopted: list[Machine] = field(default_factory=list)  # the machines that held the job, in order

    # -- the provider -----------------------------------------------------------------------------

    name = "simulated"

    def launch(self, request: LaunchRequest) -> Launched:
        now = self.clock()
        if self.zones and request.zone not in self.zones:
            raise NoCapacity(f"simulated: no zone {request.zone!r}")
        if request.market == SPOT and not self._market(request.zone).available(now):
            raise NoCapacity(f"simulated: no spot capacity in zone {request.zone or 'of the trace'} now")
        machine = Machine(f"i-{len(self.machines) + 1:08x}", request.market, now, now + self.changeover_s)
        machine.zone = request.zone
        self.machines[machine.id] = machine
        return Launched(machine.id, f"{machine.id} ({request.market})")

    def _market(self, zone: str) -> Market:
        return self.zones[zone] if self.zones else self.market

    def stop(self, instance_id: str) -> str:
        machine = self.machines.get(instance_id)
        if machine is not None and machine.end_at is None:
            machine.end_at = self.clock()
        return f"{instance_id} terminated"

    def machine_gone(self, owner: Mapping[str, Any]) -> Optional[bool]:
        machine = self.machines.get(str(owner.get("instance_id") or ""))
        return None if machine is None else not machine.alive(self.clock())

    # -- time -------------------------------------------------------------------------------------

    def advance(self, t: float) -> None:
        """Run the world from self.t to t: reclaims, progress, the job's end, adoptions."""
        for m in self.machines.values():
            if m.end_at is None and m.market == SPOT:
                market = self._market(m.zone)
                change = market.next_change(m.launched_at if m.launched_at > self.t else self.t)
                if not market.available(max(m.launched_at, self.t)):
                    m.end_at = max(m.launched_at, self.t)
                elif change <= t:
                    m.end_at = change  # reclaimed the moment the trace turns 0
        h = self.holder
        if h is not None and not self.released and self.finished_at is None:
            start, stop = max(self.t, h.resume_at), min(t, h.end_at if h.end_at is not None else t)
            if stop > start:
                step = min(stop - start, self.total_s - self.done_s)
                self.done_s += step
                h.work_s += step
                if self.done_s >= self.total_s - 1e-6:
                    self.finished_at = start + step
                    h.end_at = self.finished_at  # its jobs done: it powers off
        self.t = t
        if self.finished_at is not None:
            for m in self.machines.values():
                if m.end_at is None:
                    m.end_at = max(self.finished_at, m.launched_at)
            return
        self._honour_move(t)
        held = h is not None and not self.released and h.alive(t)
        if not held:
            for m in sorted(self.machines.values(), key=lambda m: m.ready_at):
                if m is not h and m.alive(t) and m.ready_at <= t:
                    self.holder, self.released, m.adopted = m, False, True
                    m.adopted_at, m.resume_at, m.first_work_s = t, t + self.handover_s, self.done_s
                    self.adopted.append(m)
                    break

    def _honour_move(self, t: float) -> None:
        """A move request naming the holder's home: checkpoint, hand the job over (a released
        lease), power off -- as the daemon's mirror/moves.py and stop_for_move do."""
        h = self.holder
        if h is None or self.released or not h.alive(t):
            return
        request = moves.read(self.remote, self.uid)
        if request is None or request.status != moves.ASKED or request.from_home != h.home_id:
            return
        self.released = True
        h.end_at = t

    def next_event(self, t: float, stale_after_s: float, launch_timeout_s: float) -> float:
        """The next moment something happens in the world after t."""
        times = [market.next_change(t) for market in (self.zones.values() if self.zones else [self.market])]
        for m in self.machines.values():
            if m.end_at is None and m.ready_at > t:
                times.append(m.ready_at)
            if m.end_at is not None and m.adopted and m.end_at + stale_after_s + 1.0 > t:
                times.append(m.end_at + stale_after_s + 1.0)  # its lease lapses
            if not m.adopted and m.launched_at + launch_timeout_s + 1.0 > t:
                times.append(m.launched_at + launch_timeout_s + 1.0)  # a launch that never adopted
        h = self.holder
        if h is not None and h.alive(t) and not self.released and self.finished_at is None:
            request = moves.read(self.remote, self.uid)
            if request is not None and request.status == moves.ASKED and request.from_home == h.home_id:
                times.append(t + HEARTBEAT_S)  # the holder's daemon reads it at its next heartbeat
            if h.resume_at > t:
                times.append(h.resume_at)
            if h.resume_at + HEARTBEAT_S > t:
                times.append(h.resume_at + HEARTBEAT_S)  # its first progress in the manifest: a pace
            times.append(max(t, h.resume_at) + self.total_s - self.done_s)
        later = [x for x in times if x > t + 1e-6]
        return min(later) if later else float("inf")

    # -- the manifest, as the holder's daemon writes it -------------------------------------------

    def write_manifest(self) -> None:
        h = self.holder
        state = "succeeded" if self.finished_at is not None else ("running" if h and not self.released else "queued")
        m: dict[str, Any] = {
            "version": 1,
            "uid": self.uid,
            "name": "market-benchmark",
            "state": state,
            "gpus": 1,
            "spec": {"name": "market-benchmark", "command": ["true"]},
            "submitted_at": self.submitted_at,
            "progress": {"step": int(self.done_s), "total_steps": int(self.total_s)},
            "cost": {"run_seconds": float(int(self.done_s))},
            "written_at": self.t,
        }
        if self.deadline is not None:
            m["spec"]["deadline"] = datetime.fromtimestamp(self.deadline, timezone.utc).isoformat()
        if h is not None:
            beat = self.t if h.alive(self.t) else h.end_at
            m["owner"] = {
                "host": h.id,
                "home_id": h.home_id,
                "pid": 1,
                "by": "daemon",
                "heartbeat": beat,
                "released": self.released,
                "instance_id": h.id,
            }
        if self.adopted:  # the machines it ran on, as machines.py keeps them: what the hand-over cost
            m["machines"] = [
                {
                    "home_id": a.home_id,
                    "market": a.market,
                    "from": a.adopted_at,
                    "to": min(self.t, a.end_at) if a.end_at is not None else self.t,
                    "first_step": int(a.first_work_s),
                    "last_step": int(a.first_work_s + a.work_s),
                }
                for a in self.adopted[-20:]
            ]
        # Compact, unlike a daemon's (mf.dump): the same content, written a few hundred times a job.
        self.remote.put_bytes(mf.manifest_key(self.uid), json.dumps(m, separators=(",", ":")).encode())
