"""A default that cannot exhaust the host: before its first background snapshot a job weighs its
training state against the memory it may still use; under a real limit the state exceeds
(RLIMIT_AS set by the job itself, the way a container or `ulimit -v` caps it) the periodic saves
are written synchronously, with one warning in the job's log and in `orch show`."""

from __future__ import annotations

import json
import sys

import pytest

from daemon_harness import orch_home  # noqa: F401  (fixture)
from orchestrator.model.states import JobState

# A command job: a state of STATE_MB of tensors, an address-space limit of LIMIT_MB above what the
# process has mapped now (0: no limit), three periodic saves through the runner's own CheckpointIO.
SAVER = r"""
import os, resource, sys, torch
from pathlib import Path
from training.resume.snapshot import BackgroundCheckpointIO
state_mb, limit_mb = int(sys.argv[1]), int(sys.argv[2])
state = {"state_dict": {"w": torch.ones(state_mb * 1024 * 256)}, "global_step": 0, "epoch": 0, "loops": {},
         "optimizer_states": []}
if limit_mb:
    vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + limit_mb * 1024 * 1024, resource.RLIM_INFINITY))
io = BackgroundCheckpointIO(keep=2)
ck = Path(os.environ["ORCH_CKPT_DIR"])
for step in (1, 2, 3):
    state["global_step"] = step
    io.save_checkpoint(state, ck / f"step-{step:08d}.ckpt")
io.wait()
print("background" if io.memory["background"] else "synchronous", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "state_mb,limit_mb,background", [(200, 250, False), (4, 0, True)], ids=["state over the limit", "small state"]
)
def test_a_state_the_memory_limit_cannot_hold_twice_is_saved_synchronously(orch_home, state_mb, limit_mb, background):
    h = orch_home(cpu_slots=1)
    (h.tmp / "saver.py").write_text(SAVER)
    job = h.submit("saver", command=[sys.executable, str(h.tmp / "saver.py"), str(state_mb), str(limit_mb)])
    daemon = h.start_daemon()
    done = h.wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout=120)
    h.stop_daemon(daemon)
    log = (h.run_dir(job) / "attempt-1.log").read_text()
    assert done.state is JobState.SUCCEEDED, log
    assert log.count("[orch] warning:") == (0 if background else 1), log
    assert ("background" if background else "synchronous") in log.splitlines()
    info = json.loads((h.run_dir(job) / "snapshot-memory.json").read_text())
    assert info["background"] is background and info["state_bytes"] == state_mb * 1024 * 1024
    assert sorted(p.name for p in (h.run_dir(job) / "checkpoints").iterdir()) == [
        "step-00000002.ckpt",
        "step-00000003.ckpt",
    ]
    shown = h.cli("show", str(job))
    assert shown.returncode == 0
    assert ("warning:" in shown.stdout) is not background, shown.stdout
    if not background:
        assert "written synchronously" in shown.stdout


HOLDER = r"""
import os, sys, time, torch
from pathlib import Path
from training.resume.snapshot import BackgroundCheckpointIO
io = BackgroundCheckpointIO(keep=1)
state = {"state_dict": {"w": torch.ones(4 * 1024 * 256)}, "global_step": 1, "epoch": 0, "loops": {},
         "optimizer_states": []}
io.save_checkpoint(state, Path(os.environ["ORCH_CKPT_DIR"]) / "step-00000001.ckpt")
io.wait()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_job_started_beside_a_background_snapshot_is_told_what_it_holds(orch_home):
    from daemon_harness import wait_for

    h = orch_home(cpu_slots=2)
    (h.tmp / "holder.py").write_text(HOLDER)
    release = h.tmp / "release-holder"
    holder = h.submit("holder", command=[sys.executable, str(h.tmp / "holder.py"), str(release)])
    daemon = h.start_daemon()
    wait_for(lambda: (h.run_dir(holder) / "snapshot-memory.json").exists(), 90, what="the holder's snapshot")
    second = h.submit(
        "second", command=[sys.executable, "-c", "import os; print('held', os.environ['ORCH_SNAPSHOTS_HELD_BYTES'])"]
    )
    h.wait_state(second, JobState.SUCCEEDED, timeout=60)
    release.touch()
    h.wait_state(holder, JobState.SUCCEEDED, timeout=60)
    h.stop_daemon(daemon)
    assert f"held {4 * 1024 * 1024}" in (h.run_dir(second) / "attempt-1.log").read_text()


def test_the_memory_other_jobs_snapshots_hold_counts_against_the_room():
    from training.resume.memory_guard import decide

    mb = 1024 * 1024
    assert decide(100 * mb, 300 * mb, 0)["background"] is True
    held = decide(100 * mb, 300 * mb, 150 * mb)
    assert held["background"] is False and "held by other jobs' snapshots" in held["reason"]
    assert decide(100 * mb, None, 0)["background"] is True  # cannot tell: as before
