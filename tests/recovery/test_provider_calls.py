"""Provider calls as `orch watch` makes them (recovery/launcher.py): a call past its bound is reported
failed, and while its thread is still held the pool says so (a thread cannot be killed: counting
only the calls it still waits on hid a pool full of hung ones); a launch that fails is logged with
its code. Real threads, a real bash launch command, a real file:// bucket and SQLite."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import tomli_w
from daemon_harness import wait_for

from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.recovery.build import build_provider
from orchestrator.recovery.controller import Controller
from orchestrator.recovery.jobview import launch_key
from orchestrator.recovery.launcher import Launcher, error_code
from orchestrator.spec.config import StorageSection, load_config
from orchestrator.store import Store

UID = "0123456789abcdef0123456789abcdef"


def test_a_call_past_its_bound_still_holds_its_worker_and_the_pool_says_so():
    now = [1000.0]
    launcher = Launcher(600.0, workers=1, clock=lambda: now[0])
    started, release = threading.Event(), threading.Event()

    def hangs() -> str:
        started.set()
        release.wait(60)
        return "stopped, late"

    try:
        launcher.submit("stop:vm-1", hangs, timeout_s=30.0)
        assert started.wait(20)
        now[0] += 31
        (outcome,) = launcher.finished()
        assert outcome.key == "stop:vm-1" and isinstance(outcome.error, TimeoutError)
        launcher.submit("launch:a:1", lambda: "vm-2")  # the one worker is still held: it waits
        now[0] += 60
        assert launcher.held(30.0) == [("stop:vm-1 (past its bound)", 91.0)]
        assert launcher.waiting() == 1
        release.set()  # the hung call returns at last: the worker is free, the waiting call runs
        got: list = []
        wait_for(lambda: bool(got.extend(launcher.finished()) or got), 20, what="the released call's outcome")
        assert [o.key for o in got] == ["launch:a:1"] and got[0].value == "vm-2"
        assert launcher.held(30.0) == []
    finally:
        release.set()
        launcher.close()


def test_a_failed_launch_is_logged_with_its_code(tmp_path: Path, caplog):
    remote = Remote(StorageSection(url=f"file://{tmp_path}/store"))
    (tmp_path / "launch.sh").write_text("echo 'quota exceeded' >&2; exit 3\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        tomli_w.dumps(
            {
                "storage": {"url": remote.url.raw},
                "recovery": {"provider": "command", "launch": ["bash", str(tmp_path / "launch.sh")]},
            }
        )
    )
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    store = Store(tmp_path / "orch.db")
    store.recovery_mark(launch_key(UID), time.time())  # `orch launch` in this home put it there
    m = {
        "version": 1,
        "uid": UID,
        "name": "tiny",
        "state": "queued",
        "gpus": 1,
        "spec": {"name": "tiny", "command": ["true"]},
        "owner": {},
        "progress": {"step": 0, "total_steps": 100},
        "cost": {"run_seconds": 0.0, "cost": 0.0},
        "budget": {},
    }
    remote.cas_put(mf.manifest_key(UID), mf.dump(m), None)
    c = Controller(config, store, remote, build_provider(config.recovery), controller_id="ctl")
    with caplog.at_level(logging.INFO, logger="orch.watch"):
        c.pass_once()
    assert [x.status for x in cl.read_claims(remote, UID)] == [cl.FAILED]
    (record,) = [r for r in caplog.records if "launch:" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "(RelaunchError)" in record.getMessage() and "quota exceeded" in record.getMessage()


def test_a_clouds_error_code_is_its_own():
    class ClientError(Exception):  # botocore's shape: the code in `response`
        response = {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}

    assert error_code(ClientError("no")) == "UnauthorizedOperation"
    assert error_code(TimeoutError("late")) == "TimeoutError"
