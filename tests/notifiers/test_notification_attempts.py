"""The notifications a new attempt sends speak of that attempt (issue 38, item 10): `resumed` and
`env_changed` say `Attempt: 2` on attempt 2, and `resumed` gives its own reason (where it resumes
from), not the reason the previous attempt ended with. A real job run by the daemon's own steps:
attempt 1 saves a checkpoint, installs a package into the job's PYTHONPATH and exits 75."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import pytest
from daemon_harness import OrchHome

from notifiers import Message
from orchestrator.model.states import JobState

JOB = r"""
import os, sys
site, attempt = sys.argv[1], os.environ["ORCH_ATTEMPT"]
if attempt == "1":
    info = os.path.join(site, "orch_attempt_dummy-1.0.dist-info")
    os.makedirs(info, exist_ok=True)
    open(os.path.join(info, "METADATA"), "w").write("Metadata-Version: 2.1\nName: orch-attempt-dummy\nVersion: 1.0\n")
    open(os.path.join(os.environ["ORCH_CKPT_DIR"], "step-00000005.ckpt"), "wb").write(b"state")
    sys.exit(75)
"""

EVENTS = ["retrying", "resumed", "env_changed"]


@pytest.fixture
def home(tmp_path: Path) -> Iterator[OrchHome]:
    h = OrchHome(
        tmp_path, config={"notifiers": [{"type": "webhook", "url": "http://127.0.0.1:9/hook", "events": EVENTS}]}
    )
    yield h
    h.cleanup()


def test_resumed_and_env_changed_name_the_attempt_that_starts_and_its_own_reason(home: OrchHome, tmp_path: Path):
    site = tmp_path / "site"
    site.mkdir()
    (home.tmp / "attemptjob.py").write_text(JOB)
    path = home.jobs_dir / "attemptjob.toml"
    path.write_text(
        'name = "attemptjob"\ngpus = 0\nretries = 1\n'
        f"command = {json.dumps([sys.executable, str(home.tmp / 'attemptjob.py'), str(site)])}\n"
        f"[env]\nPYTHONPATH = {json.dumps(str(site))}\n"
    )
    job_id = home.submit(path)
    d = home.local_daemon()
    home.tick_until(d, lambda: home.state(job_id).is_terminal, what="the job to end")
    assert home.job(job_id).state is JobState.SUCCEEDED and home.job(job_id).attempt == 2, home.diagnostics(job_id)

    sent = {r.payload["event"]: Message.from_dict(r.payload) for r in home.store.outbox()}
    assert set(sent) == set(EVENTS), sent
    retrying, resumed, changed = sent["retrying"], sent["resumed"], sent["env_changed"]
    assert retrying.attempt == 1  # the message about attempt 1 ending
    assert resumed.attempt == 2 and ("Attempt", "2") in resumed.fields()
    assert changed.attempt == 2 and ("Attempt", "2") in changed.fields()
    assert "step 5" in resumed.reason and "attempt 2" in resumed.reason, resumed.reason
    assert resumed.reason != retrying.reason
