"""What a job ran with: the uncommitted change recorded at submit, the first attempt's packages and
system as the baseline, and a later attempt in a changed environment raising `env_changed` (or,
with on_env_change = "stop", stopped before it trains). Real git, real interpreters listing real
distributions through importlib.metadata, the daemon's own steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from daemon_harness import OrchHome

from orchestrator.contract import DIFF_PATCH, PACKAGES_ACCEPTED, PACKAGES_TXT, SYSTEM_JSON, provenance_dir
from orchestrator.host.interpreter import job_interpreter
from orchestrator.host.packages import changes, parse_packages
from orchestrator.host.provenance import git_snapshot, patch_text
from orchestrator.model.states import JobState

DUMMY = "orch-provenance-dummy"

# Attempt 1 installs a distribution into the job's PYTHONPATH folder (a real .dist-info, found by
# importlib.metadata) and fails; attempt 2 leaves a mark and succeeds.
JOB = r"""
import os, sys
site, attempt = sys.argv[1], os.environ["ORCH_ATTEMPT"]
if attempt == "1":
    info = os.path.join(site, "orch_provenance_dummy-1.0.dist-info")
    os.makedirs(info, exist_ok=True)
    open(os.path.join(info, "METADATA"), "w").write("Metadata-Version: 2.1\nName: orch-provenance-dummy\nVersion: 1.0\n")
    sys.exit(3)
open(os.path.join(os.environ["ORCH_RUN_DIR"], "trained-%s" % attempt), "w").write("x")
"""


def git(folder: Path, *args: str) -> str:
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def home(tmp_path: Path) -> Iterator[OrchHome]:
    h = OrchHome(tmp_path, config={"notifiers": [{"type": "webhook", "url": "http://127.0.0.1:9/hook"}]})
    yield h
    h.cleanup()


def env_job(h: OrchHome, site: Path, on_env_change: str) -> Path:
    (h.tmp / "envjob.py").write_text(JOB)
    path = h.jobs_dir / "envjob.toml"
    path.write_text(
        'name = "envjob"\ngpus = 0\nretries = 1\n'
        f"on_env_change = {json.dumps(on_env_change)}\n"
        f"command = {json.dumps([sys.executable, str(h.tmp / 'envjob.py'), str(site)])}\n"
        f"[env]\nPYTHONPATH = {json.dumps(str(site))}\n"
    )
    return path


def test_a_dirty_checkout_records_its_diff_against_the_commit_and_lists_untracked_files(home: OrchHome):
    repo = home.tmp / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text("lr = 1e-3\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-qm", "first")
    (repo / "train.py").write_text("lr = 3e-4  # the change that made this run different\n")
    (repo / "notes.txt").write_text("not tracked\n")
    job = repo / "job.toml"
    job.write_text(f'gpus = 0\ncommand = ["{sys.executable}", "train.py"]\n')

    job_id = home.submit(job)

    commit = git(repo, "rev-parse", "HEAD").strip()
    recorded = home.job(job_id)
    assert recorded.git_commit == commit and recorded.git_dirty is True
    patch = (provenance_dir(home.run_dir(job_id)) / DIFF_PATCH).read_text()
    assert f"against {commit}" in patch
    assert "-lr = 1e-3" in patch and "+lr = 3e-4  # the change that made this run different" in patch
    assert "#   notes.txt" in patch and "not tracked" not in patch  # listed, not copied
    # git itself can apply what was recorded to the commit (the header is skipped)
    git(repo, "checkout", "-q", "train.py")
    git(repo, "apply", str(provenance_dir(home.run_dir(job_id)) / DIFF_PATCH))
    assert "3e-4" in (repo / "train.py").read_text()

    shown = home.cli("show", str(job_id))
    assert "provenance:" in shown.stdout and "diff.patch" in shown.stdout and "2 untracked listed" in shown.stdout


def test_a_diff_above_the_cap_is_cut_with_a_note_saying_how_big_it_was(tmp_path: Path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "big.txt").write_text("a\n" * 10)
    git(repo, "add", "big.txt")
    git(repo, "commit", "-qm", "first")
    (repo / "big.txt").write_text("b\n" * 5000)
    snap = git_snapshot(repo)
    text = patch_text(snap, max_bytes=2000)
    assert snap.dirty and len(text.encode()) < 2600
    assert f"cut at 2000 bytes; the whole diff was {len(snap.diff.encode())} bytes" in text


def test_a_package_installed_between_two_attempts_raises_env_changed_naming_it(home: OrchHome, tmp_path: Path):
    site = tmp_path / "site"
    site.mkdir()
    job_id = home.submit(env_job(home, site, "warn"))
    d = home.local_daemon()
    home.tick_until(d, lambda: home.state(job_id).is_terminal, what="the job to end")

    job = home.job(job_id)
    assert job.state is JobState.SUCCEEDED and job.attempt == 2, home.diagnostics(job_id)
    folder = provenance_dir(home.run_dir(job_id))
    first = parse_packages((folder / PACKAGES_TXT).read_text())
    assert DUMMY not in first and "pytest" in first  # the first attempt's, found like an import would
    system = json.loads((folder / SYSTEM_JSON).read_text())
    assert system["attempt"] == 1 and system["python"]["version"] == "%d.%d.%d" % sys.version_info[:3]
    changed = [e for e in home.store.events(job_id) if e.kind == "env_changed"]
    assert len(changed) == 1, home.event_kinds(job_id)
    assert f"{DUMMY} (absent) -> 1.0" in changed[0].detail and "since attempt 1" in changed[0].detail
    assert "bit-exact" not in changed[0].detail  # a harmless package: exact resume still holds
    # delivered like every event: a row in the outbox for the channel (a default event)
    assert any(r.payload["event"] == "env_changed" for r in home.store.outbox())
    shown = home.cli("show", str(job_id)).stdout
    assert "environment: changed 1 time(s) since attempt 1" in shown, shown


def test_on_env_change_stop_stops_before_training_and_accept_env_goes_on(home: OrchHome, tmp_path: Path):
    site = tmp_path / "site"
    site.mkdir()
    job_id = home.submit(env_job(home, site, "stop"))
    d = home.local_daemon()
    home.tick_until(d, lambda: home.state(job_id).is_terminal, what="the job to stop")

    job = home.job(job_id)
    assert job.state is JobState.STOPPED and job.attempt == 1, home.diagnostics(job_id)
    assert not (home.run_dir(job_id) / "trained-2").exists()  # it never started
    assert DUMMY in job.reason and "on_env_change" in job.reason and f"orch retry {job_id}" in job.reason
    kinds = home.event_kinds(job_id)
    assert kinds[-2:] == ["stopped", "env_changed"], kinds
    for _ in range(3):  # no retry loop: it stays stopped
        d.tick()
    assert home.state(job_id) is JobState.STOPPED

    accepted = home.cli("retry", str(job_id), "--accept-env")
    assert accepted.returncode == 0, accepted.stderr
    assert DUMMY in (provenance_dir(home.run_dir(job_id)) / PACKAGES_ACCEPTED).read_text()
    home.tick_until(d, lambda: home.state(job_id).is_terminal, what="the accepted job to end")
    assert home.state(job_id) is JobState.SUCCEEDED and (home.run_dir(job_id) / "trained-2").exists()
    assert home.event_kinds(job_id).count("env_changed") == 1


def test_changes_put_torch_cuda_and_training_libraries_first_as_breaking():
    first = {"python": "3.11.9", "torch": "2.13.0+cu124", "numpy": "2.1.0", "nvidia-cudnn-cu12": "9.1"}
    now = {"python": "3.11.9", "torch": "2.14.0+cu126", "numpy": "2.2.0", "nvidia-cudnn-cu12": "9.5", "rich": "13"}
    found = changes(first, now)
    assert [c.name for c in found] == ["nvidia-cudnn-cu12", "torch", "numpy", "rich"]
    assert [c.breaking for c in found] == [True, True, False, False]
    assert str(found[-1]) == "rich (absent) -> 13"


def test_the_interpreter_of_a_command_is_found_through_its_shebang_or_guessed_on_path(tmp_path: Path):
    tool = tmp_path / "bin" / "torchrun"
    tool.parent.mkdir()
    tool.write_text(f"#!{sys.executable}\nprint('hi')\n")
    tool.chmod(0o755)
    env = {"PATH": f"{tool.parent}{os.pathsep}{os.path.dirname(sys.executable)}"}
    assert job_interpreter(["torchrun", "train.py"], env, None).path == sys.executable
    assert job_interpreter([sys.executable, "x.py"], env, None).how == "the command's interpreter"
    guessed = job_interpreter(["bash", "train.sh"], env, None)
    assert guessed.path is not None and guessed.how.startswith("a guess")
