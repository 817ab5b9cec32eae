"""An error the CLI did not expect (issue 38, item 1): one line on stderr naming where the full
report went; the report is the owner's alone (0600), has no locals and no secrets. Driven through
the real `orch` with a real broken store (a file that is not a database) and a webhook key in
config.toml, which today's rich traceback printed among its locals."""

from __future__ import annotations

import re
import shutil
import stat
import tomllib
from pathlib import Path

from tests.conftest import GOOD_JOB

SECRET = "SUPERSECRETKEY123"
ENV_SECRET = "envsecretvalue987"


def _broken_home(home: Path) -> None:
    home.mkdir(mode=0o700)
    (home / "orch.db").write_bytes(b"this is not an sqlite database, " * 200)
    (home / "config.toml").write_text(
        f'[[notifiers]]\ntype = "webhook"\nurl = "https://hooks.example.com/x?key={SECRET}"\n'
    )


def _report_path(err: str) -> Path:
    found = re.search(r"the full report is in (\S+) ;", err)
    assert found, err
    return Path(found.group(1))


def test_unexpected_error_is_one_line_and_a_private_report_without_secrets(orch, home, tmp_path):
    _broken_home(home)
    job = tmp_path / "job.toml"
    job.write_text(GOOD_JOB)
    ran = orch("submit", job, env={"MY_API_TOKEN": ENV_SECRET})
    assert ran.rc == 1, ran
    lines = [line for line in ran.err.splitlines() if line.strip()]
    assert len(lines) == 1, ran.err
    assert "Traceback" not in ran.err + ran.out and "locals" not in ran.err
    assert SECRET not in ran.err + ran.out
    assert "DatabaseError" in lines[0]
    report = _report_path(ran.err)
    assert report.parent == home / "crash-reports"
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    text = report.read_text()
    assert "Traceback" in text and "file is not a database" in text
    assert SECRET not in text and ENV_SECRET not in text
    assert "── locals ──" not in text and "self = " not in text


def test_report_goes_to_a_private_temp_folder_when_the_home_cannot_hold_it(orch, home, tmp_path):
    _broken_home(home)
    (home / "crash-reports").write_text("a file where the reports folder belongs")
    job = tmp_path / "job.toml"
    job.write_text(GOOD_JOB)
    ran = orch("submit", job)
    assert ran.rc == 1 and "Traceback" not in ran.err and SECRET not in ran.err, ran
    report = _report_path(ran.err)
    try:
        assert "not under ORCH_HOME" in ran.err
        assert not report.is_relative_to(home)
        assert stat.S_IMODE(report.stat().st_mode) == 0o600
        assert stat.S_IMODE(report.parent.stat().st_mode) == 0o700
        assert SECRET not in report.read_text()
    finally:
        shutil.rmtree(report.parent, ignore_errors=True)


def test_orch_version_prints_the_packaged_version(orch):
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    ran = orch("--version").assert_ok()
    assert ran.out.strip() == f"orch {pyproject['project']['version']}"
