"""`orch show` after a lost machine says one last step, and never a count of steps lost that nobody
could measure (issue 37, item 11): the adopted attempt and the old machine's entry give the same
furthest step (its mirrored progress or its newest mirrored checkpoint, whichever is further), and
the lost attempt's line says what is known. A real store, the adoption's own import steps, and a
real `orch show` process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.adopt.import_job import _attempts
from orchestrator.home.paths import Home
from orchestrator.model.states import JobState
from orchestrator.objectstore import machines
from orchestrator.store import Store


def lost_machine_manifest(now: float) -> dict:
    """What a machine that died mid-run left in the bucket: its progress mirrored at step 1512,
    a checkpoint at step 1550 mirrored after it, its attempt still open."""
    return {
        "uid": "a" * 32,
        "name": "bert",
        "kind": "command",
        "spec": {"name": "bert", "command": ["true"], "gpus": 0},
        "attempt": 1,
        "submitted_at": now - 3600,
        "started_at": now - 3500,
        "attempts": [{"n": 1, "started_at": now - 3500, "ended_at": None, "gpu_ids": [0]}],
        "progress": {"step": 1512, "updated_at": now - 120},
        "checkpoints": [{"step": 1550, "name": "step-00001550.ckpt", "key": "k", "sha256": "0" * 64}],
        "owner": {"host": "spot-1", "home_id": "old-home", "heartbeat": now - 100},
        "machines": [
            {
                "host": "spot-1",
                "home_id": "old-home",
                "market": "spot",
                "from": now - 3500,
                "to": now - 200,
                "first_step": 0,
                "last_step": 1400,
            }
        ],
    }


def test_show_after_a_lost_machine_gives_one_last_step_and_says_what_is_known(tmp_path: Path):
    now = time.time()
    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    m = lost_machine_manifest(now)
    job = store.import_job(
        m,
        state=JobState.QUEUED,
        reason="adopted from another machine; queued to resume",
        spec_path="",
        now=now,
        attempts=_attempts(m, now),
        detail="from host spot-1",
        outgoing=[],
    )
    store.mirror_set(job.id, m["uid"], machines=machines.on_adopt(m, "new-home", market="spot", now=now, step=1550))
    store.close()

    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_HOME", "ORCH_CONFIG")}
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home.root), "show", str(job.id)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    attempt_line = next(line for line in text.splitlines() if line.strip().startswith("#1"))
    machine_line = next(line for line in text.splitlines() if line.strip().startswith("spot-1"))
    assert "steps 0 -> 1550" in attempt_line, text
    assert "steps 0 -> 1550" in machine_line, text  # the same step, not the older progress's 1512
    assert "steps lost: 0 known" in text, text
    assert "attempt #1 ended without a word" in text and "last step known 1550" in text, text
    assert "unknown" in text


def test_the_documented_bootstrap_gives_the_new_machine_a_config_naming_the_mirror(tmp_path: Path):
    """docs/recovery.md's bootstrap for the `command` provider: without a config.toml whose
    [storage] url is the mirror, the new machine's lease stays silent and `orch watch` launches yet
    another machine. Its lines before the adoption, run by bash, write that config."""
    from orchestrator.spec.config import load_config

    doc = (Path(__file__).parents[2] / "docs" / "recovery.md").read_text()
    section = doc[doc.index("### `command`") :]
    block = section[section.index("```bash\n") + len("```bash\n") :]
    block = block[: block.index("```")]
    before_adopt = block[: block.index("for uid in")]
    assert "pip install" in before_adopt
    setup = "\n".join(line for line in before_adopt.splitlines() if not line.startswith("pip "))
    url = "s3://team-bucket/orch"
    subprocess.run(
        ["bash", "-euc", setup],
        check=True,
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"], "ORCH_RECOVERY_URL": url},
        timeout=60,
    )
    config = load_config(tmp_path / ".orch" / "config.toml", required=True)
    assert config.storage.url == url
