"""An $ORCH_HOME that cannot be used (a file stands there; a folder that cannot be created, under
/proc) gives one line naming it and exit 2, for every command that needs the home — never a
traceback (issue 37, item 9). Real `orch` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [
    ["status"],
    ["submit", "JOB"],
    ["show", "1"],
    ["cancel", "1"],
    ["logs", "1"],
    ["daemon", "run"],
]


def orch(home: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_HOME", "ORCH_CONFIG")}
    env["ORCH_HOME"] = home
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )


@pytest.mark.parametrize("where", ["a file", "under /proc"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_an_unusable_home_is_one_line_naming_it_and_exit_2(tmp_path: Path, where: str, command: list[str]):
    if where == "a file":
        home = tmp_path / "orch-home"
        home.write_text("not a folder\n")
    else:
        home = Path("/proc") / f"orch-test-{os.getpid()}"
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\ncommand = ["true"]\n')
    out = orch(str(home), *[str(job) if a == "JOB" else a for a in command])
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(home) in lines[0], out.stderr
    assert ("is a file" if where == "a file" else "cannot create") in lines[0]


def test_doctor_names_an_unusable_home_and_looks_no_further(tmp_path: Path):
    home = tmp_path / "orch-home"
    home.write_text("not a folder\n")
    out = orch(str(home), "doctor")
    assert out.returncode == 1, out.stdout
    assert f"{home} is a file, not a folder" in out.stdout and "Traceback" not in out.stderr
