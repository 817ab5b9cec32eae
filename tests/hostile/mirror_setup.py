"""A real mirror to tamper with: one command job of another machine, its manifest written by
orch's own build_manifest and its two checkpoints uploaded under their content names, in a
file:// store. Tests copy the store and change what an attacker with write access would."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from orchestrator.spec.config import StorageSection, load_config
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.home.paths import Home
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.store import Store


def remote_at(store_dir: Path) -> Remote:
    return Remote(StorageSection(url=f"file://{store_dir}"))


def make_origin(folder: Path) -> tuple[Path, str]:
    """The other machine: a home with one queued command job whose copy is in folder/store.
    Returns (store folder, the job's uid)."""
    home = Home(folder / "origin-home").ensure()
    store = Store(home.db)
    job_toml = folder / "origin-job.toml"
    job_toml.write_text(f'name = "victim"\ngpus = 0\ncommand = {json.dumps([sys.executable, "-c", "pass"])}\n')
    job = submit_job(store, load_config(home.config_path()), home, job_toml, now=time.time(), machine_gpus=0)
    store_dir = folder / "store"
    store_dir.mkdir()
    remote = remote_at(store_dir)
    records = []
    for step in (20, 10):  # newest first, as the daemon keeps them
        name = f"step-{step:08d}.ckpt"
        data = f"checkpoint at step {step}".encode() * 100
        sha = hashlib.sha256(data).hexdigest()
        key = mf.checkpoint_key(job.uid, name, sha)
        remote.put_bytes(key, data)
        records.append(
            {
                "name": name,
                "step": step,
                "notice": False,
                "key": key,
                "sha256": sha,
                "bytes": len(data),
                "uploaded_at": time.time(),
            }
        )
    manifest = mf.build_manifest(
        store.get(job.id),
        [],
        home_id="origin",
        checkpoints=records,
        batch=None,
        progress={"step": 20, "total_steps": 40, "updated_at": time.time()},
        released=True,
    )
    remote.put_bytes(mf.manifest_key(job.uid), mf.dump(manifest))
    store.close()
    return store_dir, job.uid


def tampered(pristine: Path, dest: Path, uid: str, change: Callable[[dict[str, Any], Remote], Any]) -> Path:
    """A copy of the pristine store whose manifest `change` edited (in place, or by returning raw bytes)."""
    shutil.copytree(pristine, dest)
    remote = remote_at(dest)
    key = mf.manifest_key(uid)
    manifest = json.loads(remote.get_bytes(key))
    raw = change(manifest, remote)
    remote.put_bytes(key, raw if isinstance(raw, bytes) else mf.dump(manifest))
    return dest
