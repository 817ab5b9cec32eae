"""Recovery without a human, end to end on one host: a real daemon trains a tiny BERT mirrored to a
file:// store; `orch watch` (a subprocess) with a `command` provider whose launch script brings up
each replacement "machine" as a fresh ORCH_HOME running `orch adopt URL --job UID --yes` and
`orch daemon start`. Machine 1 gets a preemption notice at a random step and is killed and deleted;
the controller launches machine 2 (spot), and is itself SIGKILLed mid-launch and restarted (no
second launch); machine 2 is killed without notice at a random step; machine 3 comes up on-demand
(on_demand_after = 2) and finishes with weights torch.equal to an uninterrupted run. The
controller's events reach a real webhook on loopback, each once."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from daemon_harness import wait_for
from mirror_harness import storage_home, wait_manifest
from recovery_harness import (
    Hook,
    Watch,
    claims,
    controller_home,
    env,
    lose_machine,
    machines_folder,
    read_market,
    stop_machine,
)
from tiny_bert import TOTAL_STEPS, assert_same, lose_the_machine, progress_step, submit, weights

from orchestrator.spec.config import load_config
from orchestrator.objectstore import claims as cl
from orchestrator.objectstore.remote import Remote
from orchestrator.home.paths import Home
from orchestrator.model.states import JobState
from orchestrator.store import Store
import subprocess
import sys

pytestmark = pytest.mark.slow

STALE_MIN = 0.1  # 6 s: a lease this silent is lost


def machine_job(root: Path, uid: str):
    db = Home(root / "home").db
    if not db.exists():
        return None
    store = Store(db)
    try:
        return store.by_uid(uid)
    finally:
        store.close()


def machine_step(root: Path, uid: str) -> int:
    job = machine_job(root, uid)
    if job is None:
        return -1
    from orchestrator.contract import read_json

    return int((read_json(Home(root / "home").run_dir(job.id) / "progress.json") or {}).get("step") or 0)


def test_a_lost_machine_is_replaced_twice_spot_then_on_demand_and_the_job_ends_identical(
    workload, uninterrupted, homes, tmp_path
):
    hook = Hook()
    url = f"file://{tmp_path}/store"
    a = storage_home(tmp_path / "a", url, stale_after_minutes=STALE_MIN, keep=2)
    cfg = a.root / "config.toml"
    machine_cfg = tmp_path / "machine-config.toml"
    machine_cfg.write_text(cfg.read_text())  # what every replacement machine runs with
    cfg.write_text(cfg.read_text() + '\n[preemption]\nsources = ["file"]\npoll_seconds = 0.2\n')
    a.config = load_config(cfg, required=True)
    homes.append(a)
    machines = machines_folder(tmp_path, machine_cfg)
    croot = controller_home(
        tmp_path,
        url,
        {
            "provider": "command",
            "launch": ["bash", str(machines / "launch.sh")],
            "on_demand_after": 2,
            "max_launches": 4,
            "poll_seconds": 0.3,
            "launch_timeout_minutes": 1.5,
            "notifiers": [{"type": "webhook", "name": "hook", "url": hook.url}],
        },
        stale_after_minutes=STALE_MIN,
    )
    watch = Watch(croot, {"MACHINES": str(machines), "LAUNCH_DELAY": "1.5"})
    remote = Remote(a.config.storage)
    launched = [machines / "launch-1", machines / "launch-2", machines / "launch-3"]
    try:
        a.start_daemon()
        job_id = submit(a, workload, "recovered")
        uid = a.job(job_id).uid
        watch.start()

        # Machine 1: a notice at a random step, then the machine is gone.
        notice_at = random.Random().randint(3, 25)
        wait_for(lambda: progress_step(a, job_id) >= notice_at, 120, interval=0.02, what=f"step {notice_at}")
        (a.root / "preempt-notice").touch()
        m = wait_manifest(
            remote,
            uid,
            lambda m: m["checkpoints"] and m["checkpoints"][0]["notice"] and m["state"] == "queued",
            timeout=60,
            what="the notice checkpoint mirrored",
        )
        notice_step = m["checkpoints"][0]["step"]
        assert claims(remote, uid) == [], "a live lease must not be relaunched"
        lose_the_machine(a)
        homes.remove(a)

        # The controller claims launch 1 and calls the launch command; it is SIGKILLed while the
        # command runs (the cloud's API call already made), and restarted.
        wait_for(lambda: claims(remote, uid), 60, interval=0.05, what=lambda: f"launch 1 claimed\n{watch.output()}")
        wait_for(lambda: (launched[0] / "market").exists(), 30, interval=0.02, what="the launch command running")
        watch.kill9()
        watch.start()
        wait_for(
            lambda: (machine_job(launched[0], uid) or None) and machine_step(launched[0], uid) > notice_step,
            120,
            interval=0.2,
            what=lambda: f"machine 2 to adopt and train\n{watch.output()}\n{_log(launched[0])}",
        )
        assert read_market(launched[0]) == "spot"
        watch.wait_passes(3)  # three more passes of the restarted controller: still one launch
        assert len(claims(remote, uid)) == 1, [c.status for c in claims(remote, uid)]
        assert not launched[1].exists()

        # Machine 2: killed at a random step, no notice.
        lost_at = min(TOTAL_STEPS - 2, notice_step + random.Random().randint(2, 10))
        wait_for(lambda: machine_step(launched[0], uid) >= lost_at, 120, interval=0.02, what=f"step {lost_at}")
        lose_machine(launched[0])

        # Machine 3: on-demand, finishes.
        wait_for(
            lambda: (lambda j: j is not None and j.state is JobState.SUCCEEDED)(machine_job(launched[1], uid)),
            240,
            interval=0.3,
            what=lambda: f"machine 3 to finish\n{watch.output()}\n{_log(launched[1])}",
        )
        assert read_market(launched[1]) == "on-demand"
        found = claims(remote, uid)
        assert [c.market for c in found] == ["spot", "on-demand"] and found[-1].status == cl.LAUNCHED
        assert not launched[2].exists()

        h3 = Home(launched[1] / "home")
        job3 = machine_job(launched[1], uid)
        store3 = Store(h3.db)
        attempts = store3.attempts(job3.id)
        store3.close()
        assert attempts[0].outcome.value == "preempted" and attempts[0].step_reached == notice_step
        assert attempts[1].outcome.value == "lost" and attempts[-1].outcome.value == "succeeded"
        assert_same(uninterrupted["weights"], weights(h3.run_dir(job3.id)))

        # orch show on machine 3: the machines the job ran on, and the bill over all of them.
        shown = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "--home", str(h3.root), "show", str(job3.id), "--json"],
            capture_output=True,
            text=True,
            env=env(),
            timeout=60,
        )
        data = json.loads(shown.stdout)
        assert [mc["market"] for mc in data["machines"]] == ["", "spot", "on-demand"], data["machines"]
        assert data["machines"][1]["first_step"] == notice_step
        from orchestrator.contract import read_json

        # The goodput ledger sums over every machine: each attempt's runner figures travelled.
        goodput = (read_json(h3.run_dir(job3.id) / "progress.json") or {}).get("goodput") or {}
        assert set(goodput) == {"1", "2", "3"}, goodput
        adopted = [e["detail"] for e in data["events"] if e["kind"] == "adopted"]
        assert any("for a replacement machine (launch 2, on-demand" in d for d in adopted), adopted
        spans = [(x.ended_at or x.started_at) - x.started_at for x in attempts]
        assert data["runtime_s"] > spans[-1] and data["runtime_s"] >= 0.7 * sum(spans), (data["runtime_s"], spans)

        # The controller's events reached the webhook, each exactly once.
        delivered = hook.kinds
        want = sorted(["machine_lost", "machine_lost", "relaunched", "relaunched"])
        wait_for(lambda: delivered() == want, 20, what=lambda: f"the webhook to get {want} (got {delivered()})")
        watch.wait_passes(3)  # three more outbox deliveries: none sent again
        assert delivered() == want
    finally:
        watch.stop()
        for root in launched:
            stop_machine(root)
        hook.close()


def _log(root: Path) -> str:
    try:
        return (root / "bootstrap.log").read_text(errors="replace")[-2000:]
    except OSError:
        return ""
