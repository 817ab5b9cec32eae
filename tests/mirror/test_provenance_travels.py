"""Provenance travels in the mirror: a job adopted on another machine keeps its first machine's
packages.txt and system.json, so the new machine's first attempt is compared with them (an upgraded
distribution raises env_changed there), not taken as a fresh baseline."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest
from daemon_harness import wait_for
from mirror_harness import remote_for, storage_home, wait_manifest

from orchestrator.contract import DIFF_PATCH, PACKAGES_TXT, SYSTEM_JSON, provenance_dir
from orchestrator.model.states import JobState

pytestmark = pytest.mark.slow


def install_dummy(site: Path, version: str) -> None:
    """A real distribution as importlib.metadata finds it: a .dist-info folder on the job's PYTHONPATH."""
    for old in site.glob("orch_provenance_dummy-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"orch_provenance_dummy-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: orch-provenance-dummy\nVersion: {version}\n")


def test_provenance_travels_through_adopt_and_the_new_machine_compares_with_the_first(homes, tmp_path: Path):
    url = f"file://{tmp_path}/mirror"
    site = tmp_path / "site"
    install_dummy(site, "1.0")
    a = storage_home(tmp_path / "a", url)
    homes.append(a)
    behaviour = {"size": 4096, "every": 0.1, "steps": 40, "ckpt_every": 4}
    command = [sys.executable, str(a.tmp / "ckpt_job.py"), json.dumps(behaviour)]
    a.start_daemon()
    job_id = a.submit("travels", command=command, env={"PYTHONPATH": str(site)})
    uid = a.job(job_id).uid
    remote = remote_for(a)
    m = wait_manifest(
        remote, uid, lambda m: m["checkpoints"] and PACKAGES_TXT in m["provenance"], what="provenance mirrored"
    )
    assert set(m["provenance"]) >= {PACKAGES_TXT, SYSTEM_JSON}
    a.cli("daemon", "stop")  # a clean stop releases the lease: B adopts at once
    for proc in a.daemons:
        proc.wait(30)
    first = provenance_dir(a.run_dir(job_id))
    assert "orch-provenance-dummy==1.0" in (first / PACKAGES_TXT).read_text()

    install_dummy(site, "2.0")  # the new machine's image has another version
    b = storage_home(tmp_path / "b", url)
    homes.append(b)
    ran = b.cli("adopt", "--yes", url, "--job", uid)
    assert ran.returncode == 0, ran
    job_b = b.store.by_uid(uid)
    copied = provenance_dir(b.run_dir(job_b.id))
    for name in (PACKAGES_TXT, SYSTEM_JSON):
        assert (copied / name).read_bytes() == (first / name).read_bytes(), name
    assert not (copied / DIFF_PATCH).exists()  # submitted outside git: there was no diff to carry

    b.start_daemon()
    b.wait_state(job_b.id, JobState.SUCCEEDED, timeout=60)
    changed = wait_for(
        lambda: [e for e in b.store.events(job_b.id) if e.kind == "env_changed"], 10, what="env_changed on B"
    )
    assert "orch-provenance-dummy 1.0 -> 2.0" in changed[0].detail, changed[0].detail
    assert f"since attempt 1 on {socket.gethostname()}" in changed[0].detail
    # the baseline stays the first machine's
    assert "orch-provenance-dummy==1.0" in (copied / PACKAGES_TXT).read_text()
