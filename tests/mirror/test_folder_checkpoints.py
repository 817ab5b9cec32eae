"""A checkpoint that is a folder (a transformers.Trainer checkpoint-N/, linked into ORCH_CKPT_DIR
under a contract name) is mirrored as one tar object and comes back as the same folder on adoption."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mirror_harness import manifest, remote_for, storage_home, wait_manifest

from orchestrator.contract import newest_checkpoint
from orchestrator.model.states import JobState
from orchestrator.objectstore.packing import pack_folder

pytestmark = pytest.mark.slow

# What OrchTrainerCallback leaves: checkpoint-<n>/ (the Trainer's layout) and a relative link to it.
FOLDER_JOB = r"""
import os, sys
ck = os.environ["ORCH_CKPT_DIR"]
step = int(sys.argv[1])
folder = os.path.join(ck, f"checkpoint-{step}")
os.makedirs(os.path.join(folder, "nested"), exist_ok=True)
open(os.path.join(folder, "model.safetensors"), "wb").write(os.urandom(300_000))
open(os.path.join(folder, "trainer_state.json"), "w").write('{"global_step": %d}' % step)
open(os.path.join(folder, "nested", "rng_state.pth"), "wb").write(b"rng" * 1000)
os.symlink(f"checkpoint-{step}", os.path.join(ck, "step-%08d.ckpt" % step))
import signal, time
signal.signal(signal.SIGTERM, lambda *a: os._exit(75))  # `orch daemon stop`: nothing newer to save
time.sleep(120)
"""


# What a sharded (strategy = "fsdp") job leaves: the folder itself under the contract name, written
# under a temp name and renamed into place once complete (training/resume/sharded.py).
SHARDED_JOB = r"""
import os, sys
ck = os.environ["ORCH_CKPT_DIR"]
step = int(sys.argv[1])
temp = os.path.join(ck, ".tmp-step-%08d.ckpt" % step)
os.makedirs(temp, exist_ok=True)
for rank in (0, 1):
    open(os.path.join(temp, f"__{rank}_0.distcp"), "wb").write(os.urandom(200_000))
open(os.path.join(temp, ".metadata"), "wb").write(b"dcp" * 100)
open(os.path.join(temp, "meta.pt"), "wb").write(b"meta" * 100)
os.rename(temp, os.path.join(ck, "step-%08d.ckpt" % step))
import signal, time
signal.signal(signal.SIGTERM, lambda *a: os._exit(75))
time.sleep(120)
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_same_folder_always_packs_to_the_same_bytes(tmp_path):
    folder = tmp_path / "checkpoint-3"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "x.bin").write_bytes(b"x" * 100)
    (folder / "y.json").write_text("{}")
    one = pack_folder(folder, tmp_path / "one.tar").read_bytes()
    (folder / "y.json").touch()  # a new mtime changes nothing
    assert pack_folder(folder, tmp_path / "two.tar").read_bytes() == one


@pytest.mark.parametrize("layout", ["trainer", "sharded"])
def test_a_folder_checkpoint_is_mirrored_and_adopted_as_the_same_folder(homes, tmp_path, layout):
    """Either layout travels as one set (one tar, its sha256 in the manifest committed after it):
    a partial upload is never in the manifest, so never adopted."""
    url = f"file://{tmp_path}/mirror"
    a = storage_home(tmp_path / "a", url, None)
    homes.append(a)
    script = tmp_path / "folder_job.py"
    script.write_text(FOLDER_JOB if layout == "trainer" else SHARDED_JOB)
    a.start_daemon()
    job_id = a.submit("trainer-like", command=[sys.executable, str(script), "7"])
    uid = a.job(job_id).uid
    remote = remote_for(a)
    m = wait_manifest(
        remote,
        uid,
        lambda m: m["checkpoints"] and m["checkpoints"][0]["step"] == 7,
        what="the folder checkpoint mirrored",
    )
    record = m["checkpoints"][0]
    assert record["packed"] == "tar" and record["name"] == "step-00000007.ckpt"
    original = _files(
        a.run_dir(job_id) / "checkpoints" / ("checkpoint-7" if layout == "trainer" else "step-00000007.ckpt")
    )
    shown = json.loads(a.cli("show", str(job_id), "--json").stdout)["checkpoints"]
    assert [c["bytes"] for c in shown if c["step"] == 7] == [sum(len(b) for b in original.values())]
    a.cli("daemon", "stop")
    for proc in a.daemons:
        proc.wait(30)
    wait_manifest(remote, uid, lambda m: m["owner"]["released"], what="the lease released")

    b = storage_home(tmp_path / "b", url, None)
    homes.append(b)
    ran = b.cli("adopt", "--yes", url, "--job", uid)
    assert ran.returncode == 0, ran.stderr
    assert "resuming from step 7" in ran.stdout, ran.stdout
    job_b = b.store.by_uid(uid)
    assert job_b.state is JobState.QUEUED
    ckpts = b.run_dir(job_b.id) / "checkpoints"
    path, step = newest_checkpoint(ckpts)  # what the daemon hands the job as ORCH_RESUME_FROM
    assert step == 7 and path.is_dir()
    assert _files(path) == original
    assert not [p for p in ckpts.iterdir() if p.name.endswith(".tar")]
    if layout == "trainer":
        assert json.loads((path / "trainer_state.json").read_text()) == {"global_step": 7}
    else:
        assert {".metadata", "meta.pt", "__0_0.distcp", "__1_0.distcp"} <= set(original)
    assert manifest(remote, uid) is not None
