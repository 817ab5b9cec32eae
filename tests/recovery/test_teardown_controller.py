"""Every machine the controller launches is accounted for and stopped, with its own id; a healthy
machine is never replaced. The controller's parts with a real file:// bucket, real SQLite and real
launch, stop and alive scripts (the whole `orch watch` with real daemons: tests/mirror/test_teardown_e2e.py):
the command provider's id rule on chatty output; a machine that adopts before its launch command
returns; a launch that never adopts stopped at launch_timeout; a lease silent for 3 x stale_after
on a machine `alive` says runs is not replaced; a launch command that hangs is killed with its
whole process group."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from daemon_harness import running_in_group

from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.recovery import groups
from orchestrator.recovery.build import build_provider
from orchestrator.recovery.command import CommandProvider
from orchestrator.recovery.controller import Controller
from orchestrator.recovery.jobview import launch_key
from orchestrator.recovery.launcher import Launcher
from orchestrator.recovery.ledger import read_bucket_ledgers
from orchestrator.recovery.provider import Launched, LaunchRequest, RelaunchError, launched_from_output
from orchestrator.spec.config import StorageSection, load_config
from orchestrator.store import Store

UID = "0123456789abcdef0123456789abcdef"
STOP_SH = 'echo "$ORCH_RECOVERY_INSTANCE" >> "$DIR/stopped"\n'
ALIVE_SH = 'echo "$ORCH_RECOVERY_INSTANCE" >> "$DIR/asked"; exit "$(cat "$DIR/alive-exit" 2>/dev/null || echo 2)"\n'


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def manifest(heartbeat: Any, home: str, *, state: str = "running", released: bool = False) -> dict[str, Any]:
    owner: dict[str, Any] = {}
    if home:
        owner = {"host": f"host-{home}", "home_id": home, "pid": 1, "heartbeat": heartbeat, "released": released}
    return {
        "version": 1,
        "uid": UID,
        "name": "tiny",
        "state": state,
        "gpus": 1,
        "spec": {"name": "tiny", "command": ["true"]},
        "owner": owner,
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "budget": {},
    }


def put(remote: Remote, m: dict[str, Any]) -> None:
    got = remote.get_with_etag(mf.manifest_key(UID))
    remote.cas_put(mf.manifest_key(UID), mf.dump(m), got[1] if got else None)


def controller(
    tmp: Path, remote: Remote, clock: Clock, launch_sh: str, *, launcher: Any = None, **rec: Any
) -> Controller:
    (tmp / "launch.sh").write_text(launch_sh)
    (tmp / "stop.sh").write_text(STOP_SH)
    (tmp / "alive.sh").write_text(ALIVE_SH)
    recovery = {
        "provider": "command",
        "launch": ["bash", str(tmp / "launch.sh")],
        "stop": ["bash", str(tmp / "stop.sh")],
        "poll_seconds": 10.0,
        "launch_timeout_minutes": 5.0,
        **rec,
    }
    cfg = tmp / "config.toml"
    cfg.write_text(
        tomli_w.dumps({"storage": {"url": remote.url.raw, "stale_after_minutes": 1.0}, "recovery": recovery})
    )
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    store = Store(tmp / "orch.db")
    store.recovery_mark(launch_key(UID), clock.t)  # `orch launch` in this home put the job there
    return Controller(
        config, store, remote, build_provider(config.recovery), controller_id="ctl", clock=clock, launcher=launcher
    )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Remote:
    monkeypatch.setenv("DIR", str(tmp_path))
    return Remote(StorageSection(url=f"file://{tmp_path}/store"))


@pytest.mark.parametrize(
    "output, instance_id",
    [
        ("vm-1", "vm-1"),
        ("booting...\nvm-7\n", "vm-7"),
        ("instance=i-0abc\nwaiting for ssh\nMachine is up (market spot).", "i-0abc"),
        ("sky cluster orch-a1b2-3 (spot)", "sky cluster orch-a1b2-3 (spot)"),  # no instance= line: the whole line
        ("instance=first\ninstance=second\n", "second"),
        ("  instance=i-9  \n", "i-9"),
        ("", ""),
    ],
)
def test_the_command_providers_id_rule_an_instance_line_else_the_whole_last_line(output, instance_id):
    assert launched_from_output(output).instance_id == instance_id


def test_a_chatty_launch_is_stopped_with_its_own_id_when_its_job_finishes(tmp_path, remote):
    clock = Clock(10_000.0)
    put(remote, manifest(None, ""))  # `orch launch`: no machine holds it yet
    chatty = (
        'echo "requesting a machine"; echo "instance=vm-$ORCH_RECOVERY_LAUNCH"; echo "Machine is up (market spot)."\n'
    )
    c = controller(tmp_path, remote, clock, chatty)
    c.pass_once()
    (claim,) = cl.read_claims(remote, UID)
    assert claim.extra["instance_id"] == "vm-1" and claim.launched == "Machine is up (market spot)."
    put(remote, manifest(clock.t, "home-1"))  # it adopted
    clock.t += 10
    c.pass_once()
    assert c.ledger.machines["vm-1"].state == "holding" and c.ledger.machines["vm-1"].home_id == "home-1"
    put(remote, manifest(clock.t, "home-1", state="succeeded", released=True))
    for _ in range(3):
        clock.t += 10
        c.pass_once()
    assert lines(tmp_path / "stopped") == ["vm-1"]  # its own id, once: never "Machine" or "instance=vm-1"
    (record,) = read_bucket_ledgers(remote)[0]
    assert (record["instance_id"], record["state"], record["jobs"]) == ("vm-1", "stopped", [UID])


def test_a_machine_that_adopts_before_its_launch_command_returns_keeps_its_id(tmp_path, remote):
    """The launch command boots the machine, which adopts the job, and only then prints its id: the
    claim records the id (not "adopted by ..."), and the stop gets it."""
    clock = Clock(time.time())
    put(remote, manifest(None, ""))
    gate = tmp_path / "return-now"
    slow = f'while [ ! -e "{gate}" ]; do sleep 0.05; done; echo "instance=vm-$ORCH_RECOVERY_LAUNCH"; echo done\n'
    launcher = Launcher(60.0, clock=clock)
    try:
        c = controller(tmp_path, remote, clock, slow, launcher=launcher)
        c.pass_once()  # claimed; the launch runs off the loop, blocked on the gate
        assert cl.read_claims(remote, UID)[0].status == cl.CLAIMED
        put(remote, manifest(clock.t, "home-early"))  # the machine adopted first
        c.pass_once()
        assert cl.read_claims(remote, UID)[0].status == cl.CLAIMED  # not written as "adopted": its launch runs
        gate.touch()
        deadline = time.monotonic() + 30
        while cl.read_claims(remote, UID)[0].status != cl.LAUNCHED and time.monotonic() < deadline:
            time.sleep(0.05)
            c.pass_once()
        (claim,) = cl.read_claims(remote, UID)
        assert claim.status == cl.LAUNCHED and claim.extra["instance_id"] == "vm-1" and claim.launched == "done"
        assert claim.extra["adopted_by"] == "home-early"
        assert c.ledger.machines["vm-1"].home_id == "home-early"
        put(remote, manifest(clock.t, "home-early", state="succeeded", released=True))
        deadline = time.monotonic() + 30
        while lines(tmp_path / "stopped") == [] and time.monotonic() < deadline:
            time.sleep(0.05)
            c.pass_once()
        assert lines(tmp_path / "stopped") == ["vm-1"]
    finally:
        launcher.close()


def test_a_launch_that_never_adopts_is_stopped_at_launch_timeout_and_the_next_one_launched(tmp_path, remote):
    clock = Clock(10_000.0)
    put(remote, manifest(None, ""))
    c = controller(tmp_path, remote, clock, 'echo "instance=vm-$ORCH_RECOVERY_LAUNCH"\n', launch_timeout_minutes=1.0)
    c.pass_once()
    for _ in range(5):  # under a minute: it boots
        clock.t += 10
        c.pass_once()
    assert lines(tmp_path / "stopped") == [] and c.ledger.machines["vm-1"].state == "booting"
    clock.t += 20  # past launch_timeout: that machine never took the job
    c.pass_once()
    c.pass_once()
    assert lines(tmp_path / "stopped") == ["vm-1"]
    assert [x.extra.get("instance_id") for x in cl.read_claims(remote, UID)] == ["vm-1", "vm-2"]
    put(remote, manifest(clock.t, "home-2"))
    for _ in range(3):
        clock.t += 10
        c.pass_once()
    assert lines(tmp_path / "stopped") == ["vm-1"]  # the one that took the job runs on
    assert {m.instance_id: m.state for m in c.ledger.machines.values()} == {"vm-1": "stopped", "vm-2": "holding"}


def test_a_machine_alive_says_runs_is_not_replaced_through_3x_stale_after_then_is_when_gone(tmp_path, remote):
    clock = Clock(10_000.0)
    put(remote, manifest(None, ""))
    c = controller(
        tmp_path,
        remote,
        clock,
        'echo "instance=vm-$ORCH_RECOVERY_LAUNCH"\n',
        alive=["bash", str(tmp_path / "alive.sh")],
    )
    c.pass_once()
    put(remote, manifest(clock.t, "home-1"))  # adopted; its lease then goes silent: no bucket access
    clock.t += 10
    c.pass_once()
    (tmp_path / "alive-exit").write_text("0")
    for _ in range(18):  # 3 x stale_after (60 s), a poll each 10 s
        clock.t += 10
        c.pass_once()
    assert len(cl.read_claims(remote, UID)) == 1, "a machine the provider says runs is not replaced"
    assert set(lines(tmp_path / "asked")) == {"vm-1"}  # asked by the id its launch printed
    assert "says the machine is up" in (c.store.recovery_row(UID) or {})["note"]
    assert [e["kind"] for e in c.store.recovery_events()] == ["relaunched"]

    (tmp_path / "alive-exit").write_text("1")  # now it is gone: lost, replaced, and the old one stopped
    clock.t += 10
    c.pass_once()
    assert [x.extra.get("instance_id") for x in cl.read_claims(remote, UID)] == ["vm-1", "vm-2"]
    put(remote, manifest(clock.t, "home-2"))
    clock.t += 10
    c.pass_once()
    c.pass_once()
    assert lines(tmp_path / "stopped") == ["vm-1"]


def test_without_alive_an_alive_answer_that_cannot_tell_leaves_the_silent_lease_to_decide(tmp_path, remote):
    clock = Clock(10_000.0)
    put(remote, manifest(None, ""))
    c = controller(
        tmp_path,
        remote,
        clock,
        'echo "instance=vm-$ORCH_RECOVERY_LAUNCH"\n',
        alive=["bash", str(tmp_path / "alive.sh")],
    )
    c.pass_once()
    put(remote, manifest(clock.t, "home-1"))
    (tmp_path / "alive-exit").write_text("3")  # neither 0 nor 1: cannot tell
    for _ in range(8):
        clock.t += 10
        c.pass_once()
    assert len(cl.read_claims(remote, UID)) == 2 and "machine_lost" in [e["kind"] for e in c.store.recovery_events()]


def _gone(pgid: int) -> bool:
    deadline = time.monotonic() + 10  # SIGKILL is delivered at once; the kernel may take a moment
    while running_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return running_in_group(pgid) == []


def test_a_hanging_launch_command_is_killed_with_its_whole_process_group(tmp_path):
    pids = tmp_path / "pids"
    script = f'sleep 300 & echo "$$ $!" > "{pids}"; wait\n'
    provider = CommandProvider(["bash", "-c", script], timeout_s=1.5)
    with pytest.raises(RelaunchError, match="did not return within 2 s .killed, with its children"):
        provider.launch(LaunchRequest("file:///x", (UID,), "spot", 1))
    leader, child = (int(x) for x in pids.read_text().split())
    assert _gone(leader), "the launch command's process group is gone, its child `sleep` too"
    assert child not in running_in_group(leader)
    assert groups.running() == []


def test_kill_all_kills_a_launch_in_flight_with_its_group(tmp_path):
    pids = tmp_path / "pids"
    script = f'sleep 300 & echo "$$ $!" > "{pids}"; wait\n'
    provider = CommandProvider(["bash", "-c", script], timeout_s=300)
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            provider.launch(LaunchRequest("file:///x", (UID,), "spot", 1))
        except RelaunchError as exc:
            errors.append(exc)

    t = threading.Thread(target=launch)
    t.start()
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    leader, child = (int(x) for x in pids.read_text().split())
    assert groups.running() == [leader]
    assert groups.kill_all() == [leader]  # what `orch watch` does on its way out
    t.join(30)
    assert errors and "exited with -9" in str(errors[0])
    assert _gone(leader) and child not in running_in_group(leader)


def test_a_provider_written_before_launched_still_gets_the_rule():
    from orchestrator.recovery.provider import as_launched

    assert as_launched("machine 3") == Launched("machine 3", "machine 3")
    assert as_launched(Launched("i-1", "i-1 (g5, spot)")).instance_id == "i-1"


def test_an_alive_command_that_calls_every_new_machine_gone_backs_off_and_stops_each(tmp_path, remote):
    """A planned move's new machine that the provider calls gone while it boots is stopped, and the
    next one waits a backoff: never a machine per poll (a wrong `alive` once launched one a poll)."""
    clock = Clock(10_000.0)
    put(remote, manifest(clock.t, "home-od"))  # runs on on-demand vm-0, launched here; spot can be had
    first = cl.Claim(UID, 1, cl.LAUNCHED, "on-demand", {}, clock.t, "ctl", clock.t, launched="vm-0")
    first.extra["instance_id"] = "vm-0"
    cl.put_new(remote, first)
    launch = 'echo "$ORCH_RECOVERY_MARKET" >> "$DIR/launched"; echo "instance=vm-$ORCH_RECOVERY_LAUNCH"\n'
    c = controller(tmp_path, remote, clock, launch, alive=["bash", str(tmp_path / "alive.sh")])
    (tmp_path / "alive-exit").write_text("1")  # "gone", whatever is asked
    for _ in range(30):  # 300 s, a poll each 10 s
        put(remote, manifest(clock.t, "home-od"))
        c.pass_once()
        clock.t += 10
    launched = lines(tmp_path / "launched")
    assert 2 <= len(launched) <= 6 and set(launched) == {"spot"}, launched  # backoff 10, 20, 40, 80... s
    moved = [x for x in cl.read_claims(remote, UID) if x.extra.get("move_for")]
    assert all(x.extra.get("gone_while_booting") for x in moved[:-1])
    stopped = set(lines(tmp_path / "stopped"))
    assert {x.extra["instance_id"] for x in moved[:-1]} <= stopped and "vm-0" not in stopped


def test_a_pool_held_by_hung_calls_says_so_instead_of_queueing_silently(tmp_path, remote):
    clock = Clock(time.time())
    launcher = Launcher(600.0, workers=2, clock=clock)
    release = threading.Event()
    try:
        c = controller(tmp_path, remote, clock, "echo instance=vm-1\n", launcher=launcher)
        for key in ("launch:a:1", "stop:vm-9"):
            launcher.submit(key, release.wait)
        launcher.submit("stop:vm-10", lambda: "queued behind them")
        assert c.pool_note() == ""  # just started: not hung
        clock.t += 60
        note = c.pool_note()
        assert (
            note
            == "every provider-call worker is busy (launch:a:1 for 60 s, stop:vm-9 for 60 s): 1 more call(s) wait for one"
        )
        put(remote, manifest(None, ""))
        c.pass_once()
        (shown,) = read_bucket_ledgers(remote)[1]  # what `orch status --url` shows under the machines
        assert shown.startswith("orch watch ctl: every provider-call worker is busy (launch:a:1 for 60 s"), shown
    finally:
        release.set()
        launcher.close()


def test_a_pass_that_cannot_read_a_job_stops_none_of_its_machines(tmp_path, remote):
    clock = Clock(10_000.0)
    put(remote, manifest(None, ""))
    c = controller(tmp_path, remote, clock, 'echo "instance=vm-$ORCH_RECOVERY_LAUNCH"\n')
    c.pass_once()
    put(remote, manifest(clock.t, "home-1"))
    clock.t += 10
    c.pass_once()
    good = remote.get_bytes(mf.manifest_key(UID))
    remote.put_bytes(mf.manifest_key(UID), b"{not json")  # the bucket answers garbage for this job
    for _ in range(30):  # past launch_timeout and 3 x stale_after: nothing is decided for it
        clock.t += 10
        c.pass_once()
    assert lines(tmp_path / "stopped") == [] and len(cl.read_claims(remote, UID)) == 1
    assert c.ledger.machines["vm-1"].state == "holding"
    assert good is not None
    remote.put_bytes(mf.manifest_key(UID), mf.dump({**manifest(clock.t, "home-1"), "state": "succeeded"}))
    c.pass_once()
    c.pass_once()
    assert lines(tmp_path / "stopped") == ["vm-1"]
