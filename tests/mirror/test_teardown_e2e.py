"""Every machine `orch watch` launches is stopped, end to end on one host, every part real: `orch
launch` puts a command job in a file:// bucket, `orch watch` (a subprocess) places it with a
`command` provider whose "machines" are fresh ORCH_HOMEs with their own daemon, booted by the
docs' bootstrap as written (adopt once, `orch daemon start`), and `[recovery] stop` stops a
machine's daemon and writes its id down.

- launch scripts that print chatter, an `instance=` line, or only the id last, or that boot and
  adopt before they return: every machine launched (a lost one too) is stopped with its own id;
- a planned move whose new machine's one adopt is refused while the holder still holds the lease:
  the adoption is left pending, the new machine's daemon completes it at the hand-over, the job is
  unheld for less than changeover + 2 of the controller's polls (counted, not timed), and both
  machines are stopped;
- a launch command that hangs when `orch watch` is stopped leaves no process behind; a second
  `orch watch` in the same home refuses, naming the first one's pid."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from daemon_harness import running_in_group, wait_for
from mirror_harness import CKPT_JOB, manifest, storage_home
from recovery_harness import Watch, controller_home, env, lose_machine, stop_machine

from orchestrator.home.paths import Home
from orchestrator.model.states import JobState
from orchestrator.objectstore import claims as cl
from orchestrator.objectstore.remote import Remote
from orchestrator.spec.config import load_config
from orchestrator.store import Store

pytestmark = pytest.mark.slow

# The machine's boot, as docs/recovery.md writes it: adopt each job once, then start the daemon.
BOOT_SH = r"""#!/bin/bash
export ORCH_HOME="$1/home"
for uid in $ORCH_RECOVERY_JOBS; do
  "$PYTHON" -m orchestrator.cli adopt "$ORCH_RECOVERY_URL" --job "$uid" --yes
done
"$PYTHON" -m orchestrator.cli daemon start
"""

# The launch command, in the style STYLE says (chatty, instance, last, adopt-first).
LAUNCH_SH = r"""#!/bin/bash
set -eu
if [ "$ORCH_RECOVERY_MARKET" = spot ] && [ -e "$MACHINES/no-spot" ]; then echo "no spot in zone a"; exit 69; fi
id="launch-$ORCH_RECOVERY_LAUNCH"
m="$MACHINES/$id"
mkdir -p "$m/home"
cp "$MACHINES/machine-config.toml" "$m/home/config.toml"
echo "$ORCH_RECOVERY_MARKET" > "$m/market"
echo "$id" >> "$MACHINES/launched"
echo "requesting a $ORCH_RECOVERY_MARKET machine for $ORCH_RECOVERY_JOBS"
case "$STYLE" in
  adopt-first)  # the machine boots and adopts before this command returns
    bash "$MACHINES/boot.sh" "$m" > "$m/boot.log" 2>&1 < /dev/null
    echo "waiting for ssh..."; echo "instance=$id"; echo "Machine is up (market $ORCH_RECOVERY_MARKET)." ;;
  chatty)
    nohup bash "$MACHINES/boot.sh" "$m" > "$m/boot.log" 2>&1 < /dev/null &
    echo "instance=$id"; echo "Machine is up (market $ORCH_RECOVERY_MARKET)." ;;
  *)
    nohup bash "$MACHINES/boot.sh" "$m" > "$m/boot.log" 2>&1 < /dev/null &
    echo "$id" ;;
esac
"""

# `[recovery] stop`: the machine's power button (its daemon stops), its id written down.
STOP_SH = r"""#!/bin/bash
echo "$ORCH_RECOVERY_INSTANCE" >> "$MACHINES/stopped"
[ ! -d "$MACHINES/$ORCH_RECOVERY_INSTANCE/home" ] || \
  ORCH_HOME="$MACHINES/$ORCH_RECOVERY_INSTANCE/home" "$PYTHON" -m orchestrator.cli daemon stop > /dev/null 2>&1 || true
"""

STALE_MIN = 0.1  # 6 s


def orch(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
    )


def setup(tmp_path: Path, homes: list[Any], **recovery: Any) -> tuple[str, Path, Path]:
    url = f"file://{tmp_path}/store"
    template = storage_home(tmp_path / "template", url, stale_after_minutes=STALE_MIN)
    homes.append(template)
    machines = tmp_path / "machines"
    machines.mkdir()
    (machines / "launch.sh").write_text(LAUNCH_SH)
    (machines / "boot.sh").write_text(BOOT_SH)
    (machines / "stop.sh").write_text(STOP_SH)
    (machines / "machine-config.toml").write_text((template.root / "config.toml").read_text())
    croot = controller_home(
        tmp_path,
        url,
        {
            "provider": "command",
            "launch": ["bash", str(machines / "launch.sh")],
            "stop": ["bash", str(machines / "stop.sh")],
            "poll_seconds": 0.5,
            "launch_timeout_minutes": 2,
            **recovery,
        },
        stale_after_minutes=STALE_MIN,
    )
    return url, machines, croot


def launch_job(tmp_path: Path, croot: Path, steps: int, every: float = 0.2) -> str:
    (tmp_path / "ckpt_job.py").write_text(CKPT_JOB)
    behaviour = {"size": 4096, "every": every, "steps": steps, "ckpt_every": 2}
    job = {"name": "tiny", "command": [sys.executable, str(tmp_path / "ckpt_job.py"), json.dumps(behaviour)], "gpus": 0}
    (tmp_path / "job.toml").write_text(tomli_w.dumps(job))
    done = orch("launch", str(tmp_path / "job.toml"), "--json", home=croot)
    assert done.returncode == 0, done.stdout + done.stderr
    return str(json.loads(done.stdout)["uid"])


def machine_state(root: Path, uid: str) -> Any:
    db = Home(root / "home").db
    if not db.exists():
        return None
    store = Store(db)
    try:
        job = store.by_uid(uid)
        return job.state if job is not None else None
    finally:
        store.close()


def words(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("style, lose_first", [("chatty", False), ("adopt-first", False), ("last-line", True)])
def test_every_machine_launched_is_stopped_with_its_own_id(tmp_path, homes, style, lose_first):
    url, machines, croot = setup(tmp_path, homes)
    uid = launch_job(tmp_path, croot, steps=40 if lose_first else 15)
    watch = Watch(croot, {"MACHINES": str(machines), "STYLE": style})
    try:
        watch.start()
        first = machines / "launch-1"
        wait_for(
            lambda: machine_state(first, uid) is JobState.RUNNING,
            120,
            what=lambda: f"launch-1 runs it\n{watch.output()}",
        )
        last = first
        if lose_first:
            remote = Remote(load_config(croot / "config.toml", required=True).storage)
            wait_for(lambda: ((manifest(remote, uid) or {}).get("progress") or {}).get("step", 0) >= 4, 60)
            lose_machine(first)  # SIGKILL its daemon and job, its folder gone
            last = machines / "launch-2"
        wait_for(
            lambda: machine_state(last, uid) is JobState.SUCCEEDED,
            240,
            interval=0.3,
            what=lambda: f"{last.name} finishing the job\n{watch.output()}",
        )
        launched = words(machines / "launched")
        wait_for(
            lambda: sorted(words(machines / "stopped")) == sorted(launched),
            60,
            what=lambda: f"every machine stopped: {launched} vs {words(machines / 'stopped')}\n{watch.output()}",
        )
        assert launched == (["launch-1", "launch-2"] if lose_first else ["launch-1"])
        assert words(machines / "stopped") == launched  # each once, by its own id, in order
        assert "changed under us" not in watch.output()
        remote = Remote(load_config(croot / "config.toml", required=True).storage)
        assert [c.extra.get("instance_id") for c in cl.read_claims(remote, uid)] == launched

        def listed_stopped() -> bool:  # the stop's outcome reaches the bucket's ledger at the next pass
            shown = orch("status", "--url", url, home=tmp_path / "laptop")
            assert shown.returncode == 0 and "machines (launched by orch watch):" in shown.stdout, shown.stdout
            return all(f"{machine}  stopped" in shown.stdout for machine in launched)

        wait_for(listed_stopped, 60, what=lambda: orch("status", "--url", url, home=tmp_path / "laptop").stdout)
    finally:
        watch.stop()
        for root in machines.glob("launch-*"):
            stop_machine(root)


def test_a_planned_move_with_a_one_shot_adopt_completes_at_the_hand_over_and_stops_both_machines(tmp_path, homes):
    poll_s, changeover_min = 1.0, 0.05  # a changeover of 3 s: 3 polls
    url, machines, croot = setup(
        tmp_path, homes, poll_seconds=poll_s, max_spot_wait_minutes=0.02, changeover_minutes=changeover_min
    )
    (machines / "no-spot").touch()  # spot refused: the job goes on-demand first
    uid = launch_job(tmp_path, croot, steps=80, every=0.2)
    watch = Watch(croot, {"MACHINES": str(machines), "STYLE": "chatty"})
    on_demand, spot = machines / "launch-1", machines / "launch-2"
    remote = Remote(load_config(croot / "config.toml", required=True).storage)
    passes_file = croot / "watch.json"
    try:
        watch.start()
        wait_for(
            lambda: machine_state(on_demand, uid) is JobState.RUNNING,
            120,
            what=lambda: f"on-demand runs it\n{watch.output()}",
        )
        assert (on_demand / "market").read_text().strip() == "on-demand"
        (machines / "no-spot").unlink()  # spot is back: the policy moves the job there
        wait_for(
            lambda: (spot / "boot.log").exists() and "pending" in (spot / "boot.log").read_text(),
            120,
            what=lambda: f"the spot machine's adopt left pending\n{watch.output()}",
        )
        # Watch the hand-over: the passes the controller made while no machine held the job, from
        # the last sample where the on-demand machine held it to the first where the spot one does.
        od_home = ((manifest(remote, uid) or {}).get("owner") or {}).get("home_id")
        held_last = adopted_at = None
        deadline = time.monotonic() + 180
        while adopted_at is None and time.monotonic() < deadline:
            passes = json.loads(passes_file.read_text())["passes"]
            own = (manifest(remote, uid) or {}).get("owner") or {}
            if own.get("home_id") == od_home and not own.get("released"):
                held_last = passes
            elif own.get("home_id") not in (None, od_home) and not own.get("released"):
                adopted_at = passes
            time.sleep(0.05)
        assert held_last is not None and adopted_at is not None, watch.output()
        assert adopted_at - held_last < changeover_min * 60 / poll_s + 2, (held_last, adopted_at)
        assert machine_state(on_demand, uid) is JobState.MOVED
        wait_for(
            lambda: machine_state(spot, uid) is JobState.SUCCEEDED,
            240,
            interval=0.3,
            what=lambda: f"the spot machine finishing\n{watch.output()}",
        )
        wait_for(
            lambda: words(machines / "stopped") == ["launch-1", "launch-2"],
            60,
            what=lambda: f"both stopped: {words(machines / 'stopped')}\n{watch.output()}",
        )
        assert words(machines / "launched") == ["launch-1", "launch-2"]
        assert not (spot / "home" / "pending-adopt" / f"{uid}.json").exists()
    finally:
        watch.stop()
        for root in machines.glob("launch-*"):
            stop_machine(root)


HANG_SH = r"""#!/bin/bash
sleep 600 &
echo "$$ $!" > "$MACHINES/hung"
wait
"""


def test_a_launch_in_flight_when_orch_watch_stops_leaves_no_process_and_a_second_watch_refuses(tmp_path, homes):
    url, machines, croot = setup(tmp_path, homes)
    (machines / "launch.sh").write_text(HANG_SH)
    launch_job(tmp_path, croot, steps=5)
    watch = Watch(croot, {"MACHINES": str(machines)})
    try:
        proc = watch.start()
        hung = machines / "hung"
        wait_for(lambda: hung.exists() and hung.read_text().strip(), 60, what=lambda: watch.output())
        leader, child = (int(x) for x in hung.read_text().split())
        assert child in running_in_group(leader)
        second = orch("watch", "--once", home=croot)
        assert second.returncode == 1 and f"another `orch watch` runs for {croot} (pid {proc.pid})" in second.stderr, (
            second.stdout + second.stderr
        )
        watch.stop()  # SIGTERM
        assert proc.returncode == 0, watch.output()
        assert running_in_group(leader) == [], "the hung launch and its child are gone"
        assert "killed 1 provider command(s) still running" in watch.output()
    finally:
        watch.stop()
