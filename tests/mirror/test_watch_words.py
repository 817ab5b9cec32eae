"""What `orch watch` and `orch status --url` say, checked against a real file:// bucket: the market
shown is the lease holder's (not the newest launch's, which may be a planned move's new machine
still booting); a job `orch launch` put in the bucket waits for its first machine, not for "a
replacement"; a launch record another writer rewrote is said in words, not as a raw log line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomli_w
from bucket_key import KEYS

from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.recovery.build import build_provider
from orchestrator.recovery.controller import Controller
from orchestrator.spec.config import StorageSection, load_config
from orchestrator.store import Store

UID = "0123456789abcdef0123456789abcdef"


def orch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_HOME", "ORCH_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def bucket(tmp: Path) -> tuple[str, Remote]:
    (tmp / "bucket").mkdir(parents=True)
    url = f"file://{tmp}/bucket"
    return url, Remote(StorageSection(url=url))


def held_on_spot_while_a_move_machine_boots(remote: Remote, *, machines: bool) -> None:
    now = time.time()
    m: dict[str, Any] = {
        "version": 1,
        "uid": UID,
        "name": "held",
        "state": "running",
        "gpus": 1,
        "spec": {"name": "held", "command": ["true"]},
        "owner": mf.owner("home-a", now=now, instance_id="i-spot"),
        "machines": [{"host": "a", "home_id": "home-a", "market": "spot", "from": now - 600}] if machines else [],
        "written_at": now,
    }
    remote.cas_put(mf.manifest_key(UID), mf.dump(m), None)
    spot = cl.Claim(UID, 1, cl.LAUNCHED, "spot", {}, now - 900, "ctl", now - 890, launched="i-spot")
    coming = cl.Claim(
        UID, 2, cl.LAUNCHED, "on-demand", {}, now - 60, "ctl", now - 50, launched="i-od", extra={"move_for": "home-a"}
    )
    cl.put_new(remote, spot)
    cl.put_new(remote, coming)


def test_status_url_shows_the_holders_market_not_the_newest_launch(tmp_path):
    for with_machines in (True, False):  # what the holder recorded at adoption, else the launch its lease names
        url, remote = bucket(tmp_path / str(with_machines))
        held_on_spot_while_a_move_machine_boots(remote, machines=with_machines)
        laptop = tmp_path / f"laptop-{with_machines}"
        ran = orch(laptop, "status", "--url", url, "--json")
        assert ran.returncode == 0, ran.stderr
        [row] = json.loads(ran.stdout)
        assert row["market"] == "spot", row
        table = orch(laptop, "status", "--url", url).stdout
        assert "held  running  spot  on i-spot" in table, table


def test_a_launched_job_waits_for_its_first_machine_not_a_replacement(tmp_path):
    url, _ = bucket(tmp_path)
    home = tmp_path / "ctl"
    home.mkdir()
    cfg = {"storage": {"url": url}, "recovery": {"launch": ["false"], "poll_seconds": 1.0}}
    (home / "config.toml").write_text(tomli_w.dumps(cfg))
    job = tmp_path / "job.toml"
    job.write_text('name = "first"\ncommand = ["true"]\n')
    assert orch(home, "launch", str(job)).returncode == 0
    watched = orch(home, "watch", "--once")  # the launch command fails: the job goes on waiting
    assert watched.returncode == 0, watched.stderr
    line = next(x for x in watched.stdout.splitlines() if "  first  " in x)
    assert "waiting for its first machine since" in line and "replacement" not in line, watched.stdout


def test_a_launch_record_rewritten_by_another_writer_is_said_in_words(tmp_path):
    _, remote = bucket(tmp_path)
    cfg = tmp_path / "config.toml"
    cfg.write_text(tomli_w.dumps({"storage": {"url": remote.url.raw}, "recovery": {"launch": ["true"]}}))
    config = load_config(cfg, required=True)
    assert config.recovery is not None
    said: list[str] = []
    c = Controller(
        config,
        Store(tmp_path / "orch.db"),
        remote,
        build_provider(config.recovery),
        controller_id="c1",
        say=said.append,
        keys=KEYS,
    )
    now = time.time()
    mine = cl.put_new(remote, cl.Claim(UID, 1, cl.CLAIMED, "spot", {}, now, "c1", now))
    theirs = cl.read_claims(remote, UID)[0]
    theirs.status = cl.LAUNCHED
    cl.update(remote, theirs)  # another controller's write lands first
    c._cancel(mine, "the lease came back to life")
    assert cl.read_claims(remote, UID)[0].status == cl.LAUNCHED  # theirs is kept
    [words] = said
    assert "launch 1's record in the bucket was rewritten by someone else" in words and "under us" not in words
