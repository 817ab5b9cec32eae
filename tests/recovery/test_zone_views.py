"""Each machine's zone where people look: `orch status --url` (the machine ledger in the bucket)
and `orch show` on the machine that adopted the job (its manifest's machines list, the zone taken
from the launch claim `orch watch` wrote). The real controller with [[recovery.zones]] and a real
launch script, a file:// bucket, real SQLite, and the CLI (in-process for status, a process for
show)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli_w
from typer.testing import CliRunner

from orchestrator.adopt.import_job import _attempts, _launched_for
from orchestrator.cli.app import app
from orchestrator.home.paths import Home
from orchestrator.model.states import JobState
from orchestrator.objectstore import machines
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.recovery.build import build_provider
from orchestrator.recovery.controller import Controller
from orchestrator.recovery.jobview import launch_key
from orchestrator.spec.config import StorageSection, load_config
from orchestrator.store import Store

UID = "5a5b5c5d5e5f60718293a4b5c6d7e8f9"
NOW = 1_800_000_000.0


def _manifest() -> dict[str, Any]:
    return {
        "version": 1,
        "uid": UID,
        "name": "tiny",
        "kind": "command",
        "state": "queued",
        "gpus": 1,
        "spec": {"name": "tiny", "command": ["true"], "gpus": 1},
        "submitted_at": NOW - 600,
        "attempt": 1,
        "attempts": [],
        "owner": {},
        "progress": {"step": 10, "total_steps": 100},
        "cost": {"run_seconds": 100.0, "cost": 1.0},
        "checkpoints": [],
        "budget": {},
    }


def test_the_zone_of_each_machine_in_status_url_and_in_show(tmp_path: Path):
    url = f"file://{tmp_path}/mirror"
    remote = Remote(StorageSection(url=url, stale_after_minutes=1.0))
    remote.put_bytes(mf.manifest_key(UID), mf.dump(_manifest()))
    (tmp_path / "launch.sh").write_text('echo "instance=box-$ORCH_RECOVERY_ZONE-$ORCH_RECOVERY_LAUNCH"\n')
    recovery = {
        "provider": "command",
        "launch": ["bash", str(tmp_path / "launch.sh")],
        "zones": [{"name": "us-west-2a", "spot_price": 1.0}, {"name": "us-west-2b", "spot_price": 1.0}],
    }
    cfg = tmp_path / "config.toml"
    cfg.write_text(tomli_w.dumps({"storage": {"url": url, "stale_after_minutes": 1.0}, "recovery": recovery}))
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    store = Store(tmp_path / "orch.db")
    store.recovery_mark(launch_key(UID), NOW)  # `orch launch` put it in the bucket from this home
    Controller(
        config, store, remote, build_provider(config.recovery), controller_id="ctl", clock=lambda: NOW
    ).pass_once()

    args = ["--home", str(tmp_path / "laptop"), "status", "--url", url]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "box-us-west-2a-1  booting  us-west-2a spot" in table.output, table.output
    rows = json.loads(CliRunner().invoke(app, args + ["--json"]).stdout)
    assert [(m["instance_id"], m["zone"]) for m in rows[0]["machines"]] == [("box-us-west-2a-1", "us-west-2a")]

    # The new machine adopts: its entry in the job's machines list names the zone of its launch.
    market, zone, _ = _launched_for(remote, UID, {}, NOW + 60)
    assert (market, zone) == ("spot", "us-west-2a")
    home = Home(tmp_path / "worker").ensure()
    worker = Store(home.db)
    m = {
        **_manifest(),
        "owner": {"host": "first-box", "home_id": "home-first", "heartbeat": NOW - 300},
        "started_at": NOW - 590,
        "attempts": [{"n": 1, "started_at": NOW - 590, "ended_at": None, "gpu_ids": [0]}],
    }
    job = worker.import_job(
        m,
        state=JobState.QUEUED,
        reason="adopted",
        spec_path="",
        now=NOW,
        attempts=_attempts(m, NOW),
        detail="",
        outgoing=[],
    )
    worker.mirror_set(
        job.id, UID, machines=machines.on_adopt(m, "home-new", market=market, zone=zone, now=NOW, step=10)
    )
    worker.close()
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_HOME", "ORCH_CONFIG")}
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home.root), "show", str(job.id)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    (line,) = [row for row in shown.stdout.splitlines() if "home" not in row and " spot " in row and "steps" in row]
    assert "spot       us-west-2a  " in line, shown.stdout


def test_a_zone_read_from_the_bucket_is_shown_only_as_a_zone_name(tmp_path: Path):
    from orchestrator.objectstore import claims as cl

    remote = Remote(StorageSection(url=f"file://{tmp_path}/mirror"))
    cl.put_new(remote, cl.Claim(UID, 1, cl.LAUNCHED, "spot", {}, NOW, "ctl", NOW, extra={"zone": "\x1b[2Jevil zone"}))
    assert _launched_for(remote, UID, {}, NOW)[:2] == ("spot", "")
