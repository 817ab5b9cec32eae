"""Capacity is a market signal, not a failure, and one slow provider never stalls the others:
a real launch command that exits 69 (no capacity) makes the job wait, free -- one `capacity_wait`
event for the whole wait, one reused claim, nothing counted toward max_launches -- until capacity
returns; an exit code with no meaning is a failed launch; the jobs one lost machine held go
together on one machine of their summed GPUs; and with the threaded launcher, a launch command
that hangs leaves the controller watching, detecting and launching the other jobs meanwhile."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from bucket_key import KEYS, signed
from daemon_harness import wait_for

from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.recovery.build import build_provider
from orchestrator.recovery.controller import Controller
from orchestrator.recovery.launcher import Launcher
from orchestrator.spec.config import load_config
from orchestrator.store import Store

# A launch command whose spot market has capacity only while the file `capacity` exists; it writes
# down every request it got (jobs, market, GPUs) and answers with a machine name.
LAUNCH_SH = r"""#!/bin/bash
echo "$ORCH_RECOVERY_LAUNCH $ORCH_RECOVERY_MARKET $ORCH_RECOVERY_GPUS $ORCH_RECOVERY_JOBS" >> "$DIR/requests"
if [ "$ORCH_RECOVERY_MARKET" = spot ] && [ ! -e "$DIR/capacity" ]; then echo "InsufficientInstanceCapacity in zone a"; exit 69; fi
if [ "$ORCH_RECOVERY_MARKET" = on-demand ] && [ -e "$DIR/no-on-demand" ]; then echo "no on-demand in zone a"; exit 69; fi
if [ -e "$DIR/hang-$ORCH_RECOVERY_JOBS" ]; then while [ -e "$DIR/hang-$ORCH_RECOVERY_JOBS" ]; do sleep 0.05; done; fi
echo "machine-$ORCH_RECOVERY_LAUNCH"
"""


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def uid_of(i: int) -> str:
    return f"{i:032x}"


def put_job(remote: Remote, uid: str, heartbeat: float, *, home: str = "home-old", gpus: int = 1) -> None:
    m = {
        "version": 1,
        "uid": uid,
        "name": f"job-{uid[-2:]}",
        "state": "running",
        "gpus": gpus,
        "spec": {"name": "j", "command": ["true"]},
        "owner": {"host": f"vm-{home}", "home_id": home, "pid": 1, "by": "daemon", "heartbeat": heartbeat},
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "budget": {},
    }
    remote.cas_put(mf.manifest_key(uid), mf.dump(signed(m)), None)


def make_controller(tmp: Path, remote: Remote, clock: Any, *, launcher: Any = None, **recovery: Any) -> Controller:
    (tmp / "launch.sh").write_text(LAUNCH_SH)
    rec = {"provider": "command", "launch": ["bash", str(tmp / "launch.sh")], "poll_seconds": 10.0, **recovery}
    cfg = tmp / "config.toml"
    cfg.write_text(tomli_w.dumps({"storage": {"url": remote.url.raw, "stale_after_minutes": 1.0}, "recovery": rec}))
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    store = Store(tmp / "orch.db")
    return Controller(
        config,
        store,
        remote,
        build_provider(config.recovery),
        controller_id="ctl",
        clock=clock,
        launcher=launcher,
        keys=KEYS,
    )


def kinds(c: Controller) -> list[str]:
    return [e["kind"] for e in c.store.recovery_events()]


def requests(tmp: Path) -> list[str]:
    path = tmp / "requests"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def remote(tmp_path: Path, storage_section: Any) -> Remote:
    return Remote(storage_section(f"file://{tmp_path}/store"))


def test_no_capacity_waits_free_with_one_event_and_one_reused_claim_then_launches(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("DIR", str(tmp_path))
    clock = Clock(10_000.0)
    uid = uid_of(1)
    put_job(remote, uid, clock.t - 120)
    c = make_controller(tmp_path, remote, clock, max_launches=2)

    for _ in range(6):  # an outage longer than max_launches tries: every poll asks again
        c.pass_once()
        clock.t += 10
    assert len(requests(tmp_path)) == 6
    claims = cl.read_claims(remote, uid)
    assert [(x.n, x.status) for x in claims] == [(1, cl.NO_CAPACITY)]  # one claim, reused
    assert claims[0].extra["capacity_tries"] == 6
    assert "InsufficientInstanceCapacity" in claims[0].error
    assert kinds(c) == ["machine_lost", "capacity_wait"]  # once per wait, not per try
    row = c.store.recovery_row(uid)
    assert row["state"] == "waiting" and "no spot capacity" in row["note"] and row["launches"] == 0

    (tmp_path / "capacity").touch()  # capacity is back
    c.pass_once()
    claims = cl.read_claims(remote, uid)
    assert [(x.n, x.status) for x in claims] == [(1, cl.LAUNCHED)] and claims[0].launched == "machine-1"
    assert kinds(c) == ["machine_lost", "capacity_wait", "relaunched"]
    assert c.store.recovery_row(uid)["launches"] == 1  # max_launches = 2 is far away


def test_after_max_spot_wait_the_waiting_job_goes_on_demand_on_the_same_claim(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("DIR", str(tmp_path))
    clock = Clock(10_000.0)
    uid = uid_of(3)
    put_job(remote, uid, clock.t - 120)
    c = make_controller(tmp_path, remote, clock, max_spot_wait_minutes=1.0, max_launches=1)
    for _ in range(6):  # 50 s of refusals: still waiting for spot
        c.pass_once()
        clock.t += 10
    assert [r.split()[1] for r in requests(tmp_path)] == ["spot"] * 6
    clock.t += 10  # 60 s since the first refusal
    c.pass_once()
    assert requests(tmp_path)[-1].split()[:2] == ["1", "on-demand"]
    (claim,) = cl.read_claims(remote, uid)
    assert claim.status == cl.LAUNCHED and claim.market == "on-demand" and "max_spot_wait_minutes" in claim.extra["why"]
    assert kinds(c) == ["machine_lost", "capacity_wait", "relaunched"]  # max_launches = 1 was enough


def test_on_demand_refused_with_nowhere_else_to_go_backs_off_instead_of_every_poll(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("DIR", str(tmp_path))
    (tmp_path / "no-on-demand").touch()
    clock = Clock(10_000.0)
    uid = uid_of(4)
    put_job(remote, uid, clock.t - 120)
    c = make_controller(tmp_path, remote, clock, on_demand_after=0)  # on-demand only
    for _ in range(12):  # 110 s of polls every 10 s: tries after 0, 10, 30 and 70 s (a doubling backoff)
        c.pass_once()
        clock.t += 10
    assert [r.split()[1] for r in requests(tmp_path)] == ["on-demand"] * 4
    (claim,) = cl.read_claims(remote, uid)
    assert claim.status == cl.NO_CAPACITY and claim.extra["capacity_tries"] == 4
    (tmp_path / "no-on-demand").unlink()
    clock.t += 60  # past the next try's moment (150 s)
    c.pass_once()
    (claim,) = cl.read_claims(remote, uid)
    assert claim.status == cl.LAUNCHED and claim.market == "on-demand"


@pytest.mark.parametrize("code", [70, 1])
def test_an_exit_code_other_than_0_or_69_is_a_failed_launch_that_counts(tmp_path, remote, code):
    clock = Clock(10_000.0)
    uid = uid_of(2)
    put_job(remote, uid, clock.t - 120)
    c = make_controller(tmp_path, remote, clock)
    c.provider.argv = [sys.executable, "-c", f"import sys; print('quota'); sys.exit({code})"]  # type: ignore[attr-defined]
    c.pass_once()
    assert [x.status for x in cl.read_claims(remote, uid)] == [cl.FAILED]
    assert kinds(c) == ["machine_lost", "relaunch_failed"]
    assert f"exited with {code}: quota" in c.store.recovery_events()[-1]["detail"]


def test_the_jobs_of_one_lost_machine_come_back_together_on_one_machine_of_their_gpus(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("DIR", str(tmp_path))
    (tmp_path / "capacity").touch()
    clock = Clock(10_000.0)
    for i, gpus in ((1, 1), (2, 2), (3, 1)):  # one 4-GPU box with three jobs
        put_job(remote, uid_of(i), clock.t - 120, home="box-a", gpus=gpus)
    put_job(remote, uid_of(9), clock.t - 120, home="box-b", gpus=2)  # another machine
    c = make_controller(tmp_path, remote, clock)
    c.pass_once()

    got = sorted(requests(tmp_path))
    assert got == sorted([f"1 spot 4 {uid_of(1)} {uid_of(2)} {uid_of(3)}", f"1 spot 2 {uid_of(9)}"])
    for i in (1, 2, 3):
        (claim,) = cl.read_claims(remote, uid_of(i))
        assert claim.status == cl.LAUNCHED and claim.extra["together"] == [uid_of(1), uid_of(2), uid_of(3)]
    assert kinds(c).count("relaunched") == 4  # each job says so


def test_a_hanging_launch_does_not_stall_the_controller(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("DIR", str(tmp_path))
    (tmp_path / "capacity").touch()
    slow, other = uid_of(1), uid_of(2)
    (tmp_path / f"hang-{slow}").touch()  # this job's launch command hangs until the file goes
    put_job(remote, slow, time.time() - 120, home="box-a")
    launcher = Launcher(600.0)
    c = make_controller(tmp_path, remote, time.time, launcher=launcher)
    try:
        c.pass_once()
        wait_for(lambda: len(requests(tmp_path)) == 1, 30, what="the first launch command running")
        row = c.store.recovery_row(slow)
        assert row["state"] == "launching" and "launch 1 (spot) in progress since" in row["note"], row

        put_job(remote, other, time.time() - 120, home="box-b")  # a second machine lost meanwhile
        c.pass_once()
        assert kinds(c).count("machine_lost") == 2
        wait_for(lambda: c.pass_once() and other_launched(remote, other), 30, what="the other job's launch")
        assert c.store.recovery_row(slow)["state"] == "launching"  # still hanging, still said so
        assert cl.read_claims(remote, slow)[0].status == cl.CLAIMED

        (tmp_path / f"hang-{slow}").unlink()
        wait_for(lambda: c.pass_once() and other_launched(remote, slow), 30, what="the hanging launch returning")
        assert kinds(c).count("relaunched") == 2
    finally:
        launcher.close()


def other_launched(remote: Remote, uid: str) -> bool:
    claims = cl.read_claims(remote, uid)
    return bool(claims) and claims[-1].status == cl.LAUNCHED
