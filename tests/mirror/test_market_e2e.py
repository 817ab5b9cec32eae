"""Markets end to end on one host, every part real: `orch launch` puts a tiny-BERT job with a
deadline straight into a file:// bucket (no machine running); `orch watch` (a subprocess) with a
`command` provider whose launch script refuses spot with exit 69 while the zone "has no spot
capacity", and otherwise brings up a "machine" (a fresh ORCH_HOME that adopts and starts a
daemon; recovery_harness.py). The job waits for spot (free: one capacity_wait, not a launch),
goes on-demand after max_spot_wait_minutes, and when spot capacity is back a planned move --
asked by the controller's market policy, its spot machine launched first -- hands it over (the
on-demand daemon checkpoints, releases, exits 75, `moved`), a spot machine adopts and resumes it,
the on-demand machine is stopped by `[recovery] stop`, and the job ends with weights torch.equal
to an uninterrupted run; the spot machine is stopped once its job is done. max_launches = 2: the
capacity refusals did not count."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
from daemon_harness import wait_for
from mirror_harness import storage_home
from recovery_harness import Watch, claims, controller_home, env, machines_folder, read_market, stop_machine
from tiny_bert import assert_same, job_spec, weights

from orchestrator.home.paths import Home
from orchestrator.model.states import JobState
from orchestrator.objectstore import claims as cl
from orchestrator.objectstore import moves
from orchestrator.objectstore.remote import Remote
from orchestrator.spec.config import load_config
from orchestrator.store import Store

pytestmark = pytest.mark.slow

STALE_MIN = 0.5  # 30 s: no false loss on a busy machine (nothing here waits for a lease to lapse)

# In front of the harness's launch script: no spot while the file `no-spot` exists (exit 69).
GATE_SH = r"""#!/bin/bash
if [ "$ORCH_RECOVERY_MARKET" = spot ] && [ -e "$MACHINES/no-spot" ]; then
  echo "no spot capacity in zone a"; exit 69
fi
exec bash "$MACHINES/launch-machine.sh"
"""
# `[recovery] stop`: the machine's daemon stops (its power button), and the stop is written down.
STOP_SH = r"""#!/bin/bash
echo "$ORCH_RECOVERY_INSTANCE" >> "$MACHINES/stopped"
ORCH_HOME="$MACHINES/$ORCH_RECOVERY_INSTANCE/home" "$PYTHON" -m orchestrator.cli daemon stop
"""


def orch(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )


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
    from orchestrator.contract import read_json

    job = machine_job(root, uid)
    if job is None:
        return -1
    return int((read_json(Home(root / "home").run_dir(job.id) / "progress.json") or {}).get("step") or 0)


def state_of(root: Path, uid: str):
    job = machine_job(root, uid)
    return job.state if job is not None else None


def test_spot_refused_waits_goes_on_demand_then_moves_back_to_spot_and_ends_identical(
    workload, uninterrupted, homes, tmp_path
):
    url = f"file://{tmp_path}/store"
    template = storage_home(tmp_path / "template", url, stale_after_minutes=STALE_MIN)  # the machines' config
    homes.append(template)
    machines = machines_folder(tmp_path, template.root / "config.toml")
    (machines / "launch-machine.sh").write_text((machines / "launch.sh").read_text())
    (machines / "launch.sh").write_text(GATE_SH)
    (machines / "stop.sh").write_text(STOP_SH)
    (machines / "no-spot").touch()
    croot = controller_home(
        tmp_path,
        url,
        {
            "provider": "command",
            "launch": ["bash", str(machines / "launch.sh")],
            "stop": ["bash", str(machines / "stop.sh")],
            "max_launches": 2,
            "poll_seconds": 0.3,
            "max_spot_wait_minutes": 0.05,  # 3 s without spot capacity: on-demand
            "launch_timeout_minutes": 2,
            "changeover_minutes": 0.05,  # these "machines" come up in seconds
        },
        stale_after_minutes=STALE_MIN,
    )
    job_toml = tmp_path / "tiny.toml"
    job_toml.write_text(tomli_w.dumps(job_spec(workload, "market", slow_step_s=0.4)))
    deadline = time.strftime("%Y-%m-%dT%H:%M%z", time.localtime(time.time() + 3600))
    deadline = deadline[:-2] + ":" + deadline[-2:]
    watch = Watch(croot, {"MACHINES": str(machines)})
    on_demand, spot = machines / "launch-1", machines / "launch-2"
    try:
        done = orch("launch", str(job_toml), "--deadline", deadline, "--json", home=croot)
        assert done.returncode == 0, done.stdout + done.stderr
        uid = __import__("json").loads(done.stdout)["uid"]
        config = load_config(croot / "config.toml", required=True)
        remote = Remote(config.storage)
        watch.start()

        # Spot is refused: the job waits (one reused claim), then goes on-demand on that claim.
        wait_for(
            lambda: machine_step(on_demand, uid) >= 5,
            180,
            interval=0.2,
            what=lambda: f"the on-demand machine training\n{watch.output()}",
        )
        assert read_market(on_demand) == "on-demand"
        # One claim waited on, then launched on-demand; after it at most the policy's move back
        # to spot, its spot machine tried first (refused for capacity here: the job stays).
        found = claims(remote, uid)
        assert all(c.extra.get("move_for") and c.market == "spot" for c in found[1:]), (
            [(c.market, c.status) for c in found],
            watch.output(),
        )
        first = found[0]
        assert first.n == 1 and first.market == "on-demand" and first.extra["capacity_tries"] >= 2
        assert "capacity_wait" in watch.output()

        # Spot capacity is back: the policy moves the job (the job is far ahead of its deadline's
        # uniform line): a spot machine first, then the holder is asked to hand over.
        (machines / "no-spot").unlink()
        wait_for(
            lambda: state_of(on_demand, uid) is JobState.MOVED,
            120,
            interval=0.2,
            what=lambda: f"the on-demand machine handing the job over\n{watch.output()}",
        )
        wait_for(
            lambda: state_of(spot, uid) is JobState.SUCCEEDED,
            240,
            interval=0.3,
            what=lambda: f"the spot machine finishing the job\n{watch.output()}",
        )
        assert read_market(spot) == "spot"
        assert_same(uninterrupted["weights"], weights(Home(spot / "home").run_dir(machine_job(spot, uid).id)))

        # The on-demand machine was stopped after the move; the spot one once its job was done.
        stopped = machines / "stopped"
        wait_for(
            lambda: stopped.exists() and set(stopped.read_text().split()) == {"launch-1", "launch-2"},
            60,
            what=lambda: f"both machines stopped\n{watch.output()}",
        )
        assert stopped.read_text().split()[0] == "launch-1"
        found = claims(remote, uid)
        assert [(c.market, c.status) for c in found] == [("on-demand", cl.LAUNCHED), ("spot", cl.LAUNCHED)]
        assert cl.launches(found) == 2  # max_launches = 2: the capacity refusals were not launches
        request = moves.read(remote, uid)
        assert request is not None and request.status == moves.DONE and request.from_instance == "launch-1"
        od_store = Store(Home(on_demand / "home").db)
        try:
            od_job = od_store.by_uid(uid)
            assert od_job is not None and od_job.state is JobState.MOVED
            assert [e.kind for e in od_store.events(od_job.id, kinds=["market_move"])] == ["market_move"]
        finally:
            od_store.close()

        # The bill spans both machines and names their markets (orch show on the last machine).
        spot_job = machine_job(spot, uid)
        shown = orch("show", str(spot_job.id), "--json", home=spot / "home")
        data = __import__("json").loads(shown.stdout)
        assert [mc["market"] for mc in data["machines"]] == ["on-demand", "spot"], data["machines"]

        # From anywhere: the bucket's view.
        shown = orch("status", "--url", url, home=tmp_path / "laptop")
        assert shown.returncode == 0 and f"{uid[:12]}  market  succeeded  spot" in shown.stdout, shown.stdout
    finally:
        watch.stop()
        for root in (on_demand, spot):
            stop_machine(root)
