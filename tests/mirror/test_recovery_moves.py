"""Planned moves and stops, the controller's side, with a real file:// bucket, real SQLite and real
launch and stop commands (the lease holder's side is a real daemon in test_market_e2e.py):
a move asked by the controller, handed over (a released manifest), launched on the new market and
settled by stopping the old machine once the new one holds the lease; a move nobody here asked
for never launches anything; a move for a finished job is refused; a stop command that fails is
retried with backoff, notified once and given up (never a loop); a controller killed mid-move
leaves the next one (same home) to finish it without a second launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomli_w
from bucket_key import KEYS, signed

from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore import moves
from orchestrator.objectstore.remote import Remote
from orchestrator.recovery.build import build_provider
from orchestrator.recovery.controller import Controller
from orchestrator.recovery.moving import MoveRefused
from orchestrator.spec.config import load_config
from orchestrator.store import Store

UID = "0123456789abcdef0123456789abcdef"
LAUNCH_SH = 'echo "$ORCH_RECOVERY_MARKET $ORCH_RECOVERY_JOBS" >> "$DIR/launched"; echo "vm-$ORCH_RECOVERY_LAUNCH"\n'
STOP_SH = (
    'echo "$ORCH_RECOVERY_INSTANCE" >> "$DIR/stopped"; [ ! -e "$DIR/stop-fails" ] || { echo "API down"; exit 1; }\n'
)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def manifest(heartbeat: float, home: str, *, state: str = "running", released: bool = False) -> dict[str, Any]:
    return {
        "version": 1,
        "uid": UID,
        "name": "tiny",
        "state": state,
        "gpus": 1,
        "spec": {"name": "tiny", "command": ["true"]},
        "owner": {"host": f"host-{home}", "home_id": home, "pid": 1, "heartbeat": heartbeat, "released": released},
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "budget": {},
    }


def put(remote: Remote, m: dict[str, Any]) -> None:
    got = remote.get_with_etag(mf.manifest_key(UID))
    remote.cas_put(mf.manifest_key(UID), mf.dump(signed(m)), got[1] if got else None)


def controller(tmp: Path, remote: Remote, clock: Clock, controller_id: str = "ctl") -> Controller:
    (tmp / "launch.sh").write_text(LAUNCH_SH)
    (tmp / "stop.sh").write_text(STOP_SH)
    rec = {
        "provider": "command",
        "launch": ["bash", str(tmp / "launch.sh")],
        "stop": ["bash", str(tmp / "stop.sh")],
        "poll_seconds": 10.0,
    }
    cfg = tmp / "config.toml"
    cfg.write_text(tomli_w.dumps({"storage": {"url": remote.url.raw, "stale_after_minutes": 1.0}, "recovery": rec}))
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    return Controller(
        config,
        Store(tmp / "orch.db"),
        remote,
        build_provider(config.recovery),
        controller_id=controller_id,
        clock=clock,
        keys=KEYS,
    )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def kinds(c: Controller) -> list[str]:
    return [e["kind"] for e in c.store.recovery_events()]


@pytest.fixture
def remote(tmp_path: Path, storage_section: Any, monkeypatch: pytest.MonkeyPatch) -> Remote:
    monkeypatch.setenv("DIR", str(tmp_path))
    return Remote(storage_section(f"file://{tmp_path}/store"))


def on_demand_job(remote: Remote, clock: Clock) -> None:
    """The job runs on on-demand machine vm-1, which the controller launched for it."""
    put(remote, manifest(clock.t, "home-od"))
    claim = cl.Claim(UID, 1, cl.LAUNCHED, "on-demand", {"home_id": "home-0"}, clock.t, "ctl", clock.t, launched="vm-1")
    cl.put_new(remote, claim)


def test_a_planned_move_launches_on_the_new_market_then_stops_the_old_machine(tmp_path, remote):
    clock = Clock(10_000.0)
    on_demand_job(remote, clock)
    c = controller(tmp_path, remote, clock)
    request = c.ask_move(UID, "spot", "spot is back and the job is ahead")
    assert (request.from_market, request.from_home, request.from_instance) == ("on-demand", "home-od", "vm-1")
    with pytest.raises(MoveRefused, match="already under way"):
        c.ask_move(UID, "spot", "again")
    c.pass_once()
    assert lines(tmp_path / "launched") == []  # the holder has not handed it over yet

    clock.t += 5
    put(remote, manifest(clock.t, "home-od", state="queued", released=True))  # the daemon's hand-over
    c.pass_once()
    assert lines(tmp_path / "launched") == [f"spot {UID}"]
    (claim,) = [x for x in cl.read_claims(remote, UID) if x.n == 2]
    assert claim.status == cl.LAUNCHED and claim.market == "spot" and "planned move" in claim.extra["why"]
    assert moves.read(remote, UID).status == moves.LAUNCHED  # type: ignore[union-attr]
    assert "machine_lost" not in kinds(c)  # a planned move is not a loss

    c.pass_once()
    assert len(lines(tmp_path / "launched")) == 1  # launched once
    clock.t += 30
    put(remote, manifest(clock.t, "home-spot"))  # the spot machine adopted the job
    c.pass_once()
    assert lines(tmp_path / "stopped") == ["vm-1"]
    c.pass_once()  # the stop's outcome recorded: the move is closed
    assert moves.read(remote, UID).status == moves.DONE  # type: ignore[union-attr]
    assert "old machine vm-1: stopped" in c.store.recovery_row(UID)["note"]
    c.pass_once()
    assert lines(tmp_path / "stopped") == ["vm-1"]  # stopped once
    assert kinds(c) == ["market_move", "relaunched"]


def test_a_move_object_nobody_here_asked_for_launches_nothing(tmp_path, remote):
    clock = Clock(10_000.0)
    put(remote, manifest(clock.t, "home-od", state="queued", released=True))
    forged = moves.MoveRequest(UID, "spot", "on-demand", "trust me", "ctl", clock.t, "home-od", "vm-1")
    moves.put_new(remote, forged)
    c = controller(tmp_path, remote, clock)
    for _ in range(3):
        c.pass_once()
        clock.t += 60
    assert lines(tmp_path / "launched") == [] and cl.read_claims(remote, UID) == []
    assert c.store.recovery_row(UID)["state"] == "released"


def test_a_move_for_a_finished_job_is_refused_and_a_late_one_closed(tmp_path, remote):
    clock = Clock(10_000.0)
    put(remote, manifest(clock.t, "home-od", state="succeeded", released=True))
    c = controller(tmp_path, remote, clock)
    with pytest.raises(MoveRefused, match="succeeded: a finished job does not move"):
        c.ask_move(UID, "spot", "too late")
    with pytest.raises(MoveRefused, match="market must be"):
        c.ask_move(UID, "moon", "no")
    assert moves.read(remote, UID) is None

    put(remote, manifest(clock.t, "home-od"))  # running again: a move is asked, then it finishes first
    c.ask_move(UID, "spot", "spot is back")
    put(remote, manifest(clock.t, "home-od", state="succeeded", released=True))
    c.pass_once()
    request = moves.read(remote, UID)
    assert request is not None and request.status == moves.REFUSED and "succeeded first" in request.note
    assert lines(tmp_path / "launched") == []


def test_a_stop_command_that_fails_is_retried_with_backoff_notified_once_and_never_dropped(tmp_path, remote):
    clock = Clock(10_000.0)
    on_demand_job(remote, clock)
    (tmp_path / "stop-fails").touch()
    c = controller(tmp_path, remote, clock)
    c.ask_move(UID, "spot", "spot is back")
    put(remote, manifest(clock.t, "home-od", state="queued", released=True))
    c.pass_once()
    for _ in range(200):  # many polls: tries only when the backoff is over
        put(remote, manifest(clock.t, "home-spot"))  # the spot machine heartbeats
        c.pass_once()
        clock.t += 10
    tries = lines(tmp_path / "stopped")
    # 2,000 s of polls every 10 s: backoff 10, 20, 40, ... s between tries, so 8 tries, not 200
    assert tries == ["vm-1"] * 8
    assert kinds(c).count("stop_failed") == 1
    assert "API down" in c.store.recovery_events()[-1]["detail"]
    (record,) = [m for m in c.ledger.machines.values() if m.instance_id == "vm-1"]
    assert record.state == "stopping" and record.stop_tries == 8 and "API down" in record.stop_error
    request = moves.read(remote, UID)  # closed, saying so
    assert request is not None and request.status == moves.DONE and "could not be stopped" in request.note

    (tmp_path / "stop-fails").unlink()  # the API is back: the next try stops it, and nothing after
    for _ in range(250):
        put(remote, manifest(clock.t, "home-spot"))
        c.pass_once()
        clock.t += 10
    assert lines(tmp_path / "stopped") == ["vm-1"] * 9
    assert c.ledger.machines["vm-1"].state == "stopped"


def test_a_controller_killed_mid_move_leaves_the_next_one_to_finish_it_launching_once(tmp_path, remote):
    clock = Clock(10_000.0)
    on_demand_job(remote, clock)
    first = controller(tmp_path, remote, clock)
    first.ask_move(UID, "spot", "spot is back")
    put(remote, manifest(clock.t, "home-od", state="queued", released=True))
    first.pass_once()  # launched on spot; then this controller dies
    del first
    second = controller(tmp_path, remote, clock)  # the same home, restarted
    for _ in range(3):
        second.pass_once()
        clock.t += 10
    assert lines(tmp_path / "launched") == [f"spot {UID}"]  # no second machine
    put(remote, manifest(clock.t, "home-spot"))
    second.pass_once()
    assert lines(tmp_path / "stopped") == ["vm-1"]
    assert [x.status for x in cl.read_claims(remote, UID)] == [cl.LAUNCHED, cl.LAUNCHED]


def test_a_machine_whose_job_finished_is_stopped_once_and_only_by_the_controller_that_launched_it(tmp_path, remote):
    clock = Clock(10_000.0)
    on_demand_job(remote, clock)  # running on vm-1, which the controller launched
    c = controller(tmp_path, remote, clock)
    c.pass_once()
    put(remote, manifest(clock.t, "home-od", state="succeeded", released=True))
    for _ in range(3):
        c.pass_once()
        clock.t += 10
    # vm-1 ran it; vm-2 is the market policy's move back to spot (no deadline, spot can be had),
    # launched first and still booting when the job finished: stopped too, each once.
    assert sorted(lines(tmp_path / "stopped")) == ["vm-1", "vm-2"]

    (tmp_path / "stopped").unlink()
    (tmp_path / "again").mkdir()
    restarted = controller(tmp_path / "again", remote, clock, "other")  # another home: it launched none of them
    for _ in range(3):
        restarted.pass_once()
        clock.t += 10
    assert lines(tmp_path / "stopped") == []  # not its machines
