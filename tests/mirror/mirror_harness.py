"""Helpers for the mirror tests: an OrchHome with [storage], a checkpoint-writing command job,
and reading a job's copy straight from the store (the tests never trust the daemon's word)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from tests.daemon_harness import OrchHome, wait_for

from orchestrator.spec.config import load_config
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote

from tests.bucket_key import KEY_ENV, put_in_environment

# A command job: writes step-N checkpoints (`size` random bytes each) every `every` seconds up to
# `steps`, progress.json after each, then waits for a release file (if any) and exits 0. SIGTERM:
# a notice checkpoint at the current step, exit 75.
CKPT_JOB = r"""
import json, os, signal, sys, time
b = json.loads(sys.argv[1])
ck, run = os.environ["ORCH_CKPT_DIR"], os.environ["ORCH_RUN_DIR"]
resume = os.environ.get("ORCH_RESUME_FROM") or ""
step = int(os.path.basename(resume).split("-")[-1].split(".")[0]) if resume else 0
def save(name):
    tmp = os.path.join(ck, ".tmp-" + name)
    size = b["big"] if b.get("big_from") and step >= b["big_from"] else b["size"]
    if name.startswith("notice-") and b.get("notice_size"):
        size = b["notice_size"]
    with open(tmp, "wb") as f:
        f.write(os.urandom(size))
        f.flush(); os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ck, name))
def progress():
    tmp = os.path.join(run, ".progress.tmp")
    open(tmp, "w").write(json.dumps({"step": step, "total_steps": b["steps"], "updated_at": time.time()}))
    os.replace(tmp, os.path.join(run, "progress.json"))
def on_term(*_):
    save("notice-step-%08d.ckpt" % step)
    os._exit(75)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(run, "resumed-from.txt"), "a").write(f"{step}\n")
while step < b["steps"]:
    time.sleep(b["every"])
    step += 1
    progress()
    if step % b.get("ckpt_every", 1) == 0:
        save("step-%08d.ckpt" % step)
release = b.get("release")
while release and not os.path.exists(release):
    time.sleep(0.05)
sys.exit(0)
"""


def storage_home(
    folder: Path, url: str, endpoint: Optional[str] = None, *, gpus: Optional[list[int]] = None, **storage: Any
) -> OrchHome:
    """`gpus`: [daemon] gpus, GPU slots rehearsed on this CPU machine (ORCH_GPUS_ON_CPU=1)."""
    folder.mkdir(parents=True, exist_ok=True)
    put_in_environment()  # the daemon signs its manifests with the test key its config names
    h = OrchHome(folder, cpu_slots=2, grace_seconds=10, gpus_on_cpu=bool(gpus), gpus=gpus or [])
    settings = {
        "heartbeat_seconds": 1,
        "throttle_seconds": 0.5,
        "stale_after_minutes": 0.05,
        "keep": 2,
        "part_size_mb": 5,
        "signing_key_env": KEY_ENV,  # manifests signed (tests/mirror/conftest.py sets the key)
        **storage,
    }
    lines = ["", "[storage]", f"url = {json.dumps(url)}"] + ([f"endpoint = {json.dumps(endpoint)}"] if endpoint else [])
    lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    config = h.root / "config.toml"
    config.write_text(config.read_text() + "\n".join(lines) + "\n")
    h.config = load_config(config, required=True)
    (folder / "ckpt_job.py").write_text(CKPT_JOB)
    return h


def ckpt_job(h: OrchHome, name: str, **behaviour: Any) -> int:
    b = {"size": 64 * 1024, "every": 0.2, "steps": 6, **behaviour}
    return h.submit(name, command=[sys.executable, str(h.tmp / "ckpt_job.py"), json.dumps(b)])


def remote_for(h: OrchHome) -> Remote:
    return Remote(h.config.storage)


def manifest(remote: Remote, uid: str) -> Optional[dict[str, Any]]:
    raw = remote.get_bytes(mf.manifest_key(uid))
    return None if raw is None else json.loads(raw)


def wait_manifest(remote: Remote, uid: str, pred, timeout: float = 30, what: str = "") -> dict[str, Any]:
    def check() -> Optional[dict[str, Any]]:
        m = manifest(remote, uid)
        return m if m is not None and pred(m) else None

    return wait_for(check, timeout, what=what or f"the manifest of {uid} to satisfy {pred}", interval=0.1)


def named_keys(m: dict[str, Any]) -> list[str]:
    return [c["key"] for c in m.get("checkpoints") or []]


def now() -> float:
    return time.time()
