"""The machine ledger on both kinds of bucket (moto S3 on loopback and file://), with the real
controller, real SQLite and real launch and stop scripts: a machine launched, adopted and stopped
once its job finished, by its own id; the ledger in the bucket is what `orch status --url` lists
(the CLI, reading the bucket), and a restarted controller of the same home, which knows the
machine from its store, stops it once its job finishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from typer.testing import CliRunner

from orchestrator.cli.app import app
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.recovery.build import build_provider
from orchestrator.recovery.controller import Controller
from orchestrator.recovery.jobview import launch_key
from orchestrator.recovery.ledger import ledger_key
from orchestrator.spec.config import load_config
from orchestrator.store import Store

UID = "0123456789abcdef0123456789abcdef"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def manifest(heartbeat: Any, home: str, state: str = "running") -> dict[str, Any]:
    owner = {"host": "vm", "home_id": home, "pid": 1, "heartbeat": heartbeat, "released": state != "running"}
    return {
        "version": 1,
        "uid": UID,
        "name": "tiny",
        "state": state,
        "gpus": 1,
        "spec": {"name": "tiny", "command": ["true"]},
        "owner": owner if home else {},
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "budget": {},
    }


def put(remote: Remote, m: dict[str, Any]) -> None:
    got = remote.get_with_etag(mf.manifest_key(UID))
    remote.cas_put(mf.manifest_key(UID), mf.dump(m), got[1] if got else None)


def controller(tmp: Path, remote: Remote, clock: Clock) -> Controller:
    (tmp / "launch.sh").write_text('echo "starting"; echo "instance=box-$ORCH_RECOVERY_LAUNCH"; echo "up."\n')
    (tmp / "stop.sh").write_text(f'echo "$ORCH_RECOVERY_INSTANCE" >> {tmp}/stopped\n')
    storage: dict[str, Any] = {"url": remote.url.raw, "stale_after_minutes": 1.0}
    if remote.settings.endpoint:
        storage["endpoint"] = remote.settings.endpoint
    recovery = {
        "provider": "command",
        "launch": ["bash", str(tmp / "launch.sh")],
        "stop": ["bash", str(tmp / "stop.sh")],
        "poll_seconds": 10.0,
    }
    cfg = tmp / "config.toml"
    cfg.write_text(tomli_w.dumps({"storage": storage, "recovery": recovery}))
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    config.storage = remote.settings
    store = Store(tmp / "orch.db")
    store.recovery_mark(launch_key(UID), clock.t)
    return Controller(config, store, remote, build_provider(config.recovery), controller_id="ctl", clock=clock)


@pytest.mark.parametrize("restart", [False, True])
def test_the_ledger_follows_a_machine_from_launch_to_stop_in_the_bucket(tmp_path, remote, restart):
    clock = Clock(10_000.0)
    put(remote, manifest(None, ""))
    c = controller(tmp_path, remote, clock)
    c.pass_once()
    put(remote, manifest(clock.t, "home-1"))
    clock.t += 10
    c.pass_once()
    body = json.loads(remote.get_bytes(ledger_key("ctl")) or b"{}")
    assert [(m["instance_id"], m["state"], m["home_id"]) for m in body["machines"]] == [("box-1", "holding", "home-1")]
    if restart:  # the controller is restarted (same home): it knows box-1 from its store
        c.store.close()
        c = controller(tmp_path, remote, clock)
    put(remote, manifest(clock.t, "home-1", state="succeeded"))
    for _ in range(2):
        clock.t += 10
        c.pass_once()
    assert (tmp_path / "stopped").read_text().split() == ["box-1"]
    body = json.loads(remote.get_bytes(ledger_key("ctl")) or b"{}")
    assert [(m["instance_id"], m["state"]) for m in body["machines"]] == [("box-1", "stopped")]

    laptop = tmp_path / "laptop"  # anywhere: a config naming only the endpoint (S3 on loopback)
    laptop.mkdir()
    endpoint = remote.settings.endpoint
    (laptop / "config.toml").write_text(tomli_w.dumps({"storage": {"endpoint": endpoint}}) if endpoint else "")
    args = ["--home", str(laptop), "status", "--url", remote.url.raw]
    shown = CliRunner().invoke(app, args + ["--json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.stdout)
    assert rows[0]["machines"] == [
        {"instance_id": "box-1", "state": "stopped", "market": "spot", "zone": None, "cost": None, "stop_error": ""}
    ]
    table = CliRunner().invoke(app, args)
    assert "machines (launched by orch watch):" in table.output and "box-1  stopped  spot" in table.output
