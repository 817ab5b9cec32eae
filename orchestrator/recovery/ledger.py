"""The machine ledger: every machine `orch watch` launched, from the launch's return until it is
stopped -- its id, zone and market, the jobs it was launched for, the home that adopted them, its
state and what it has cost -- kept in the controller's store (so a restarted controller still
stops what it launched) and in the bucket (`machines/<controller>.json`, what `orch status --url`
lists under the jobs).

States: booting (launched, no lease of its jobs yet), holding (a lease of one of its jobs is fresh
and names it), idle (it holds nothing and is not needed: a stop is due), stopping (the provider's
stop asked, or being retried: `stop_error` says why it failed), stopped, unknown (it held a lease
that went silent: lost or cut off; the provider's alive answer and the job's replacement decide)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from ..objectstore.remote import Remote, StorageError, TooLarge

BOOTING, HOLDING, IDLE, STOPPING, STOPPED, UNKNOWN = "booting", "holding", "idle", "stopping", "stopped", "unknown"
STATES = (BOOTING, HOLDING, IDLE, STOPPING, STOPPED, UNKNOWN)
PREFIX = "machines/"
MAX_LEDGER_BYTES = 4 * 1024 * 1024
SHOWN_AFTER_STOP_S = 7 * 86400.0  # a machine stopped longer ago leaves the bucket's copy (the store keeps it)


def ledger_key(controller_id: str) -> str:
    return f"{PREFIX}{controller_id}.json"


@dataclass
class Machine:
    instance_id: str
    market: str
    jobs: list[str]
    launched_at: float
    state: str = BOOTING
    zone: Optional[str] = None  # the zone it was launched in, where the provider has zones
    launch: str = ""  # "<uid>:<n>": the launch claim that brought it up
    move_for: str = ""  # a planned move's new machine: the home it takes the job from
    home_id: str = ""  # the orch home that adopted its jobs (one per machine)
    price_hour: Optional[float] = None  # [pricing]'s hourly price on its market (None: not priced)
    cost: Optional[float] = None  # up-time so far at price_hour
    held_at: Optional[float] = None  # the last pass a lease of its jobs named it
    stop_why: str = ""
    stop_tries: int = 0
    stop_error: str = ""
    stopped_at: Optional[float] = None
    text: str = ""  # what the provider said at launch
    updated_at: float = 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Optional["Machine"]:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        try:
            m = cls(**known)
        except TypeError:
            return None
        return m if m.instance_id and m.state in STATES else None


@dataclass
class Ledger:
    store: Any
    remote: Remote
    controller_id: str
    clock: Callable[[], float]
    machines: dict[str, Machine] = field(default_factory=dict)
    note: str = ""  # the controller's own state worth a line in `orch status --url` (a busy pool)
    _dirty: set[str] = field(default_factory=set)
    _bucket_dirty: bool = False
    _written_note: str = ""

    def __post_init__(self) -> None:
        for record in self.store.machine_records(self.remote.url.raw):
            m = Machine.from_dict(record)
            if m is not None:
                self.machines[m.instance_id] = m

    def get(self, instance_id: str) -> Optional[Machine]:
        return self.machines.get(instance_id)

    def add(self, m: Machine) -> Machine:
        old = self.machines.get(m.instance_id)
        if old is not None:
            return old
        self.machines[m.instance_id] = m
        self.touch(m)
        return m

    def by_home(self, home_id: str) -> Optional[Machine]:
        for m in self.machines.values():
            if home_id and m.home_id == home_id and m.state != STOPPED:
                return m
        return None

    def live(self) -> list[Machine]:
        return [m for m in self.machines.values() if m.state != STOPPED]

    def touch(self, m: Machine) -> None:
        m.updated_at = self.clock()
        self._dirty.add(m.instance_id)

    def set_state(self, m: Machine, state: str) -> None:
        if m.state != state:
            m.state = state
            self.touch(m)

    def price(self, m: Machine) -> None:
        """Its cost so far: up-time (launch to stop, or now) at its market's hourly price."""
        if m.price_hour is None:
            return
        end = m.stopped_at if m.stopped_at is not None else self.clock()
        cost = round(max(0.0, end - m.launched_at) / 3600 * m.price_hour, 4)
        if cost != m.cost:
            m.cost = cost
            self._bucket_dirty = True  # the store row follows at the next state change

    def flush(self) -> None:
        """Write the changed records to the store, and the ledger to the bucket when anything in it
        changed (a failed bucket write is tried again at the next pass)."""
        now = self.clock()
        url = self.remote.url.raw
        for instance_id in sorted(self._dirty):
            self.store.machine_put(url, instance_id, asdict(self.machines[instance_id]), now)
        if self._dirty or self._bucket_dirty or self.note != self._written_note:
            self._written_note = self.note
            body = {
                "controller": self.controller_id,
                "updated_at": now,
                "note": self.note,
                "machines": [asdict(m) for m in self.ordered() if not _long_stopped(m, now)],
            }
            try:
                self.remote.put_bytes(ledger_key(self.controller_id), json.dumps(body, indent=1).encode())
                self._bucket_dirty = False
            except StorageError:
                self._bucket_dirty = True
        self._dirty.clear()

    def ordered(self) -> list[Machine]:
        return sorted(self.machines.values(), key=lambda m: (m.launched_at, m.instance_id))


def _long_stopped(m: Machine, now: float) -> bool:
    return m.state == STOPPED and m.stopped_at is not None and now - m.stopped_at > SHOWN_AFTER_STOP_S


def read_bucket_ledgers(remote: Remote) -> tuple[list[dict[str, Any]], list[str]]:
    """Every controller's machines in the bucket, and their notes, for `orch status --url`
    (unreadable ledgers skipped)."""
    out: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        keys = [str(meta["path"]) for meta in remote.list(PREFIX)]
    except (StorageError, FileNotFoundError):
        return out, notes
    for key in sorted(k for k in keys if k.endswith(".json")):
        try:
            got = remote.get_with_etag(key, max_bytes=MAX_LEDGER_BYTES)
            body = json.loads(got[0].decode("utf-8")) if got is not None else None
        except (StorageError, TooLarge, UnicodeDecodeError, ValueError):
            continue
        if isinstance(body, dict):
            if body.get("note"):
                notes.append(f"orch watch {str(body.get('controller') or '?')[:12]}: {str(body['note'])[:300]}")
            for record in body.get("machines") or []:
                if isinstance(record, dict) and record.get("instance_id"):
                    out.append(record)
    return out, notes


def machine_line(record: dict[str, Any]) -> str:
    """One machine of the ledger for people (`orch status --url`)."""
    where = " ".join(str(x) for x in (record.get("zone"), record.get("market")) if x)
    jobs = ",".join(str(u)[:12] for u in record.get("jobs") or [])
    line = f"{record.get('instance_id')}  {record.get('state')}  {where or '?'}  jobs {jobs or '-'}"
    if record.get("home_id"):
        line += f"  home {str(record['home_id'])[:12]}"
    if isinstance(record.get("cost"), (int, float)):
        line += f"  cost {record['cost']:.2f}"
    if record.get("state") == STOPPING:
        line += f"; stopping ({record.get('stop_why') or '?'}), try {int(record.get('stop_tries') or 0) + 1}"
        if record.get("stop_error"):
            line += f", last: {str(record['stop_error'])[:160]}"
    elif record.get("state") == STOPPED and record.get("stop_why"):
        line += f"; stopped: {record['stop_why']}"
    return line
