"""`orch watch`'s parts with real stores and real subprocesses, cheap: config.toml's [recovery]
refused with exit 2, a launch command that does not exist or always fails (backoff, one
notification per failure, then left alone at max_launches, never a hot loop), two controllers on
one bucket (S3 on loopback and file://) launching once, a restarted controller queuing no event
twice, a lease that comes back cancelling the claim, the market policy and the budget; and a real
daemon whose lease pauses (SIGSTOP, shorter than stale_after) never triggers a launch, while the
same daemon killed does."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import tomli_w
from bucket_key import KEYS, signed
from daemon_harness import wait_for
from mirror_harness import ckpt_job, remote_for, storage_home, wait_manifest
from recovery_harness import Watch, controller_home
from typer.testing import CliRunner

from orchestrator.cli.app import app
from orchestrator.spec.config import load_config
from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.recovery import market as mk
from orchestrator.recovery.command import CommandProvider
from orchestrator.recovery.controller import Controller
from orchestrator.recovery.build import build_provider
from orchestrator.recovery.provider import Launched, LaunchRequest, RelaunchError
from orchestrator.store import Store

UID = "0123456789abcdef0123456789abcdef"


# -- config.toml [recovery]: bad input is exit 2, naming file and field ------------------------


@pytest.mark.parametrize(
    "table, field",
    [
        ('[recovery]\nprovider = "gcp"\nlaunch = ["true"]\n', "recovery.provider"),
        ("[recovery]\nlaunch = []\n", "recovery.launch"),
        ('[recovery]\nlaunch = [""]\n', "recovery.launch"),
        ('[recovery]\nprovider = "command"\n', "recovery"),
        ('[recovery]\nprovider = "aws"\n', "recovery"),
        ('[recovery]\nlaunch = ["true"]\nmax_launches = 0\n', "recovery.max_launches"),
        ('[recovery]\nlaunch = ["true"]\npoll_seconds = 0\n', "recovery.poll_seconds"),
        ('[recovery]\nlaunch = ["true"]\n[recovery.aws]\nendpoint = "ftp://x"\n', "recovery.aws.endpoint"),
        ("", "no [recovery] table"),
    ],
)
def test_orch_watch_refuses_a_bad_recovery_table_with_exit_2_naming_file_and_field(tmp_path, table, field):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[storage]\nurl = "file://{tmp_path}/store"\n' + table)
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "home"), "--config", str(cfg), "watch", "--once"])
    assert result.exit_code == 2, result.output
    assert str(cfg) in result.output and field in result.output, result.output
    assert "Traceback" not in result.output


# -- a mirror with one job whose machine is gone -------------------------------------------------


def manifest_of(heartbeat: float, **over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "version": 1,
        "uid": UID,
        "name": "tiny",
        "state": "running",
        "gpus": 1,
        "spec": {"name": "tiny", "command": ["true"]},
        "owner": {"host": "old-vm", "home_id": "home-old", "pid": 1, "by": "daemon", "heartbeat": heartbeat},
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "budget": {},
    }
    m.update(over)
    return m


def put_manifest(remote: Remote, m: dict[str, Any]) -> None:
    got = remote.get_with_etag(mf.manifest_key(UID))
    remote.cas_put(mf.manifest_key(UID), mf.dump(signed(m)), got[1] if got else None)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Counting:
    """A provider that counts its launches (slowly, so two controllers overlap)."""

    name = "counting"

    def __init__(self, delay_s: float = 0.0, fail: Optional[str] = None) -> None:
        self.requests: list[LaunchRequest] = []
        self.delay_s, self.fail = delay_s, fail
        self.lock = threading.Lock()

    def launch(self, request: LaunchRequest) -> str:
        time.sleep(self.delay_s)
        with self.lock:
            self.requests.append(request)
        if self.fail:
            raise RelaunchError(self.fail)
        return f"machine {request.launch_number}"

    def machine_gone(self, owner: Any) -> Optional[bool]:
        return None


def config_for(tmp: Path, url: str, **recovery: Any) -> Any:
    cfg = tmp / "config.toml"
    rec = {"provider": "command", "launch": ["true"], "poll_seconds": 10.0, **recovery}
    cfg.write_text(tomli_w.dumps({"storage": {"url": url, "stale_after_minutes": 1.0}, "recovery": rec}))
    return load_config(cfg, required=True)


def controller(tmp: Path, remote: Remote, provider: Any, clock: Clock, name: str = "c", **recovery: Any) -> Controller:
    folder = tmp / name
    folder.mkdir(exist_ok=True)
    config = config_for(folder, remote.url.raw, **recovery)
    if remote.url.scheme == "s3":
        config.storage = remote.settings.model_copy(update={"stale_after_minutes": 1.0})
    store = Store(folder / "orch.db")
    return Controller(config, store, remote, provider, controller_id=f"ctl-{name}", clock=clock, keys=KEYS)


@pytest.fixture
def file_remote(tmp_path: Path, storage_section) -> Remote:
    return Remote(storage_section(f"file://{tmp_path}/store"))


def kinds(c: Controller) -> list[str]:
    return [e["kind"] for e in c.store.recovery_events()]


@pytest.mark.parametrize("argv", [["/nonexistent/launch-machine"], [sys.executable, "-c", "import sys; sys.exit(3)"]])
def test_a_launch_command_that_fails_backs_off_notifies_each_failure_and_stops_at_max_launches(
    tmp_path, file_remote, argv
):
    clock = Clock(10_000.0)
    put_manifest(file_remote, manifest_of(clock.t - 120))  # silent 2 min, stale after 1
    c = controller(tmp_path, file_remote, CommandProvider(argv), clock, max_launches=3)
    c.pass_once()
    assert [x.status for x in cl.read_claims(file_remote, UID)] == ["failed"]
    assert kinds(c) == ["machine_lost", "relaunch_failed"]
    assert ("not found" if "nonexistent" in argv[0] else "exited with 3") in c.store.recovery_events()[-1]["detail"]
    for _ in range(20):  # the controller polls again and again: no new launch before the backoff is over
        c.pass_once()
    assert len(cl.read_claims(file_remote, UID)) == 1
    clock.t += 10  # poll_seconds: the first backoff
    c.pass_once()
    assert len(cl.read_claims(file_remote, UID)) == 2
    clock.t += 15
    c.pass_once()
    assert len(cl.read_claims(file_remote, UID)) == 2, "the second backoff is twice the first"
    clock.t += 5
    c.pass_once()
    assert len(cl.read_claims(file_remote, UID)) == 3
    for _ in range(5):
        clock.t += 3600
        c.pass_once()
    assert len(cl.read_claims(file_remote, UID)) == 3  # max_launches
    assert kinds(c) == ["machine_lost"] + ["relaunch_failed"] * 4  # three failures, then "left alone", once
    assert "max_launches = 3" in c.store.recovery_events()[-1]["detail"]
    assert c.store.recovery_row(UID)["state"] == "left alone"


def test_a_restarted_controller_neither_launches_nor_notifies_twice_and_a_live_lease_cancels_a_claim(
    tmp_path, file_remote
):
    clock = Clock(10_000.0)
    put_manifest(file_remote, manifest_of(clock.t - 120))
    provider = Counting()
    c1 = controller(tmp_path, file_remote, provider, clock)
    c1.pass_once()
    assert len(provider.requests) == 1 and provider.requests[0].market == "spot"
    assert provider.requests[0].job_uids == (UID,) and provider.requests[0].launch_number == 1
    c1.store.close()
    c2 = controller(tmp_path, file_remote, provider, clock)  # the same home: the same store
    for _ in range(3):
        clock.t += 5
        c2.pass_once()
    assert len(provider.requests) == 1
    assert kinds(c2) == ["machine_lost", "relaunched"]
    assert c2.store.recovery_row(UID)["state"] == "waiting"
    # `orch status` in the controller's home and the dashboard say it waits for a machine, since when.
    shown = CliRunner().invoke(app, ["--home", str(tmp_path / "c"), "status"])
    assert shown.exit_code == 0 and "waiting for a replacement machine since" in shown.output, shown.output
    from orchestrator.dashboard.data import queue
    from orchestrator.home.paths import Home

    home = Home(tmp_path / "c")  # the dashboard reads through a read-only store, as it serves the page
    (row,) = queue(Store(home.db, read_only=True), home, c2.config, clock.t)["recovery"]
    assert row["uid"] == UID and row["waiting_since"] == clock.t - 15 - 120 and row["launches"] == 1
    # A claim made, then the old machine's lease comes back (a network blip): cancelled, no launch.
    claim = cl.Claim(UID, 2, cl.CLAIMED, "spot", {"home_id": "home-old", "heartbeat": 1.0}, clock.t, "x", clock.t)
    cl.put_new(file_remote, claim)
    put_manifest(file_remote, manifest_of(clock.t - 1))
    c2.pass_once()
    assert cl.read_claims(file_remote, UID)[-1].status == cl.CANCELLED
    assert c2.store.recovery_row(UID)["state"] == "alive" and len(provider.requests) == 1


def test_two_controllers_on_one_store_launch_once(tmp_path, remote):
    clock = Clock(time.time())
    put_manifest(remote, manifest_of(clock.t - 120))
    provider = Counting(delay_s=0.3)
    a = controller(tmp_path, remote, provider, clock, "a")
    b = controller(tmp_path, remote, provider, clock, "b")
    barrier = threading.Barrier(2)

    def run(c: Controller) -> None:
        barrier.wait()
        c.pass_once()

    threads = [threading.Thread(target=run, args=(c,)) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(provider.requests) == 1
    assert [x.status for x in cl.read_claims(remote, UID)] == ["launched"]


def test_the_budget_refuses_a_launch_it_cannot_pay_for(tmp_path, file_remote):
    pricing = config_for(tmp_path, "file:///x").pricing
    pricing.gpu_hour, pricing.on_demand_gpu_hour = 1.0, 3.0
    # spent 1.0; 0.25 h left + 5 min to boot: 0.33 at 1/h on spot, 1.0 at 3/h on-demand
    m = manifest_of(0.0, budget={"max_cost": 1.8})
    assert mk.budget_problem(m, pricing, "spot") is None
    assert "over its max_cost" in (mk.budget_problem(m, pricing, "on-demand") or "")
    assert mk.budget_problem(manifest_of(0.0, budget={"max_cost": 1.0}), pricing, "spot")  # spent it all

    clock = Clock(10_000.0)
    put_manifest(file_remote, manifest_of(clock.t - 120, budget={"max_cost": 1.0}))
    provider = Counting()
    c = controller(tmp_path, file_remote, provider, clock)
    c.pass_once()
    c.pass_once()
    assert provider.requests == [] and cl.read_claims(file_remote, UID) == []
    assert kinds(c) == ["machine_lost", "relaunch_failed"]
    assert "max_cost" in c.store.recovery_events()[-1]["detail"]


def test_build_provider_names_the_command_provider(tmp_path):
    config = config_for(tmp_path, f"file://{tmp_path}/s", launch=["echo", "hi"])
    provider = build_provider(config.recovery)
    assert provider.name == "command"
    assert provider.launch(LaunchRequest("file:///x", (UID,), "spot", 1)) == Launched("hi", "hi")


# -- a real daemon's lease: a pause is not a loss, a kill is ------------------------------------


@pytest.mark.slow
def test_a_paused_lease_never_triggers_a_launch_and_a_dead_one_does(tmp_path, homes):
    url = f"file://{tmp_path}/store"
    h = storage_home(tmp_path / "a", url, stale_after_minutes=0.15)  # 9 s
    homes.append(h)
    proc = h.start_daemon()
    job_id = ckpt_job(h, "long", steps=10_000, every=0.1, ckpt_every=50)
    uid = h.job(job_id).uid
    remote = remote_for(h)
    wait_manifest(remote, uid, lambda m: m["state"] == "running", timeout=60, what="the job running")
    marker = tmp_path / "launched"
    launch = ["sh", "-c", f'echo "$ORCH_RECOVERY_LAUNCH $ORCH_RECOVERY_MARKET $ORCH_RECOVERY_JOBS" >> {marker}']
    croot = controller_home(
        tmp_path, url, {"provider": "command", "launch": launch, "poll_seconds": 0.2}, stale_after_minutes=0.15
    )
    watch = Watch(croot)
    try:
        watch.start()
        watch.wait_passes(2)  # the controller sees the lease beating
        frozen = time.monotonic()
        os.killpg(proc.pid, signal.SIGSTOP)  # the daemon frozen for a third of stale_after
        watch.wait_passes(3)  # the controller looks at the silent lease, several times
        time.sleep(max(0.0, 3.0 - (time.monotonic() - frozen)))  # the pause: the fault itself, not a wait
        os.killpg(proc.pid, signal.SIGCONT)
        watch.wait_passes(5)  # and at the lease beating again
        assert not marker.exists(), watch.output()
        assert cl.read_claims(remote, uid) == []
        h.kill9(proc)
        wait_for(marker.exists, 60, what=lambda: f"a launch\n{watch.output()}")  # once stale_after has passed
        assert marker.read_text().split() == ["1", "spot", uid]
        out = Store(croot / "orch.db")

        def kinds() -> list[str]:
            return [e["kind"] for e in out.recovery_events()]

        # The launch runs off the controller's loop: its outcome is recorded at the pass after it returns.
        wait_for(lambda: kinds() == ["machine_lost", "relaunched"], 30, what=lambda: f"relaunched\n{kinds()}")
        out.close()
    finally:
        watch.stop()
        try:
            os.killpg(proc.pid, signal.SIGCONT)
        except OSError:
            pass


def test_claims_ignore_what_is_not_a_claim(file_remote):
    file_remote.put_bytes(cl.claims_prefix(UID) + "notes.txt", b"hello")
    file_remote.put_bytes(cl.claim_key(UID, 1), b"not json")
    found = cl.read_claims(file_remote, UID)
    assert [(c.n, c.status) for c in found] == [(1, "failed")]  # its number is taken
    assert json.loads(cl.Claim(UID, 2, "claimed", "spot", {}, 1.0, "c", 1.0).to_json())["n"] == 2
