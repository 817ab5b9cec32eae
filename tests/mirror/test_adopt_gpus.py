"""Adopting a job onto another number of GPUs, with a real file:// bucket, real `orch` processes and
a real store: `orch adopt --gpus N` keeps the effective batch (the accumulation adjusted) or is
refused in one line (exit 2, nothing taken); a job whose job.toml allows fewer GPUs (`min_gpus`)
is adopted onto as many as the machine has, by `orch adopt` and by a pending adoption alike."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Optional

import tomli_w
from recovery_harness import env

from orchestrator.adopt.pending import park, pending
from orchestrator.adopt.pending_run import complete_pending
from orchestrator.home.paths import Home
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.spec.config import StorageSection, load_config
from orchestrator.store import Store


def orch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )


def put_job(remote: Remote, uid: str, name: str, *, min_gpus: Optional[int] = None, gpus: int = 2) -> None:
    """A built-in 2-GPU job left by a machine that stopped (its lease released): batch 8 x
    accumulate 3 x 2 GPUs = 48 samples per optimizer step."""
    spec: dict[str, Any] = {
        "name": name,
        "gpus": gpus,
        "model": {"name_or_path": "/models/tiny", "task": "causal-lm"},
        "data": {"train": "/data/train.jsonl"},
        "train": {"batch_size": 8, "accumulate_grad_batches": 3, "strategy": "fsdp", "max_epochs": 1},
    }
    if min_gpus is not None:
        spec["min_gpus"] = min_gpus
    m = {
        "version": 1,
        "uid": uid,
        "name": name,
        "state": "queued",
        "kind": "builtin",
        "gpus": gpus,
        "spec": spec,
        "owner": mf.owner("home-old", now=time.time() - 60, released=True),
        "written_at": time.time(),
    }
    remote.cas_put(mf.manifest_key(uid), mf.dump(m), None)


def machine(tmp_path: Path, url: str, name: str, gpus: list[int]) -> Path:
    """A home whose daemon hands out `gpus` (slots on this CPU machine)."""
    root = tmp_path / name
    root.mkdir()
    (root / "config.toml").write_text(tomli_w.dumps({"storage": {"url": url}, "daemon": {"gpus": gpus}}))
    return root


def bucket(tmp_path: Path) -> tuple[str, Remote]:
    (tmp_path / "bucket").mkdir()
    url = f"file://{tmp_path}/bucket"
    return url, Remote(StorageSection(url=url))


def local_job(root: Path, uid: str) -> Any:
    store = Store(Home(root).db)
    try:
        return store.by_uid(uid)
    finally:
        store.close()


def test_adopt_with_gpus_keeps_the_effective_batch_or_is_refused_in_one_line(tmp_path):
    url, remote = bucket(tmp_path)
    uid = "a" * 32
    put_job(remote, uid, "sft")
    root = machine(tmp_path, url, "new", [0])
    before = remote.get_bytes(mf.manifest_key(uid))

    refused = orch(root, "adopt", url, "--job", uid, "--yes", "--gpus", "5")  # 48 / 5 samples: not whole
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"refused: orch adopt --gpus 5: job {uid[:12]} (sft)'s effective batch is 48 (batch 8 x accumulate 3 x 2 GPU(s)); "
        "5 GPU(s) cannot keep it (use a number that divides 6)"
    ]
    assert "Traceback" not in refused.stdout and remote.get_bytes(mf.manifest_key(uid)) == before  # nothing taken
    assert local_job(root, uid) is None

    done = orch(root, "adopt", url, "--job", uid, "--yes", "--gpus", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[builtin, queued, 1 GPU, was 2: checkpoint resharded]" in done.stdout
    assert f"adopted {uid[:12]} (sft) as job 1 on 1 GPU(s) (was 2)" in done.stdout
    job = local_job(root, uid)
    assert job.gpus == 1 and job.spec["gpus"] == 1 and job.spec["train"]["accumulate_grad_batches"] == 6
    written = tomllib.loads((root / "runs" / str(job.id) / "job.toml").read_text())
    assert written["gpus"] == 1 and written["train"]["accumulate_grad_batches"] == 6  # what the runner reads
    shown = json.loads(orch(root, "show", str(job.id), "--json").stdout)
    assert [e["detail"] for e in shown["events"] if e["kind"] == "adopted"][0].endswith("on 1 GPU(s) (was 2)")


def test_a_job_allowing_fewer_gpus_is_adopted_onto_what_the_machine_has(tmp_path):
    """On a 1-GPU machine: `min_gpus = 1` adopts on 1 GPU (what a replacement machine's bootstrap
    `orch adopt --all --yes` does); no `min_gpus` is adopted as it asks, with a note that this
    daemon cannot start it; `min_gpus = 2` is refused here, left in the bucket for another machine."""
    url, remote = bucket(tmp_path)
    fewer, asks, floor = "b" * 32, "c" * 32, "d" * 32
    put_job(remote, fewer, "fewer", min_gpus=1)
    put_job(remote, asks, "asks")
    put_job(remote, floor, "floor", min_gpus=2)
    root = machine(tmp_path, url, "small", [0])

    done = orch(root, "adopt", url, "--all", "--yes")
    assert done.returncode == 1, done.stdout + done.stderr  # one refused, two adopted
    assert f"adopted {fewer[:12]} (fewer) as job" in done.stdout and "on 1 GPU(s) (was 2)" in done.stdout
    job = local_job(root, fewer)
    assert job.gpus == 1 and job.spec["train"]["accumulate_grad_batches"] == 6 and job.spec["min_gpus"] == 1
    assert local_job(root, asks).gpus == 2
    assert (
        f"note: job {asks[:12]} (asks) it asks for 2 GPUs and sets no min_gpus (job.toml) to resume on fewer: "
        "this machine's daemon cannot start it (`orch adopt --gpus 1` resumes it on 1)"
    ) in done.stderr
    assert (
        f"refused: job {floor[:12]} (floor): not adopted: it asks for 2 GPUs (at least 2, min_gpus) and this machine has 1"
        in done.stderr
    )
    assert local_job(root, floor) is None and not mf.lease_holder(
        json.loads(remote.get_bytes(mf.manifest_key(floor)) or b"{}"), time.time(), 3600
    )


def test_a_pending_adoption_on_a_machine_with_fewer_gpus_adopts_with_the_count_it_allows(tmp_path):
    """A 4-GPU job (accumulate 3 x 4 ranks) left pending on a 3-GPU machine: with `min_gpus = 1` the
    daemon's try adopts it on 3 (accumulate 4: the most GPUs that keep the effective batch); one
    parked by `orch adopt --gpus 2` keeps that count (accumulate 6)."""
    url, remote = bucket(tmp_path)
    allowed, asked = "e" * 32, "f" * 32
    put_job(remote, allowed, "allowed", min_gpus=1, gpus=4)
    put_job(remote, asked, "asked", gpus=4)
    root = machine(tmp_path, url, "spot", [0, 1, 2])
    home = Home(root).ensure()
    park(home, url, allowed, [], "a planned move", time.time())  # the bootstrap's one adopt, held then
    park(home, url, asked, [], "a planned move", time.time(), gpus=2)
    config = load_config(root / "config.toml", required=True)
    store = Store(home.db)
    try:
        assert complete_pending(home, config, store) == 2
        one, two = store.by_uid(allowed), store.by_uid(asked)
        assert one is not None and one.gpus == 3 and one.spec["train"]["accumulate_grad_batches"] == 4
        assert two is not None and two.gpus == 2 and two.spec["train"]["accumulate_grad_batches"] == 6
        assert pending(home) == []
    finally:
        store.close()


def test_min_gpus_above_gpus_is_refused_in_one_line(tmp_path):
    (tmp_path / "job.toml").write_text('name = "x"\ngpus = 2\nmin_gpus = 3\ncommand = ["true"]\n')
    root = tmp_path / "home"
    root.mkdir()
    ran = orch(root, "submit", str(tmp_path / "job.toml"))
    assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    assert "min_gpus: 3 is more than gpus (2)" in ran.stderr and "Traceback" not in ran.stderr
