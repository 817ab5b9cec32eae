"""Small hints a user needs at `orch submit` (issue 37, item 12): the same job.toml queued twice in
a row gets a note (not a refusal), and a data file that looks ';'-separated says so. Real `orch`
processes on a real home."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def orch(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_HOME", "ORCH_CONFIG")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    )


def test_the_same_job_file_submitted_twice_in_a_row_gets_a_note_and_is_queued(tmp_path: Path):
    home, job = tmp_path / "home", tmp_path / "job.toml"
    job.write_text('name = "seed"\ngpus = 0\ncommand = ["true"]\n')
    first = orch(home, "submit", str(job), cwd=tmp_path)
    assert first.returncode == 0 and "second copy" not in first.stderr, first.stderr
    second = orch(home, "submit", str(job), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "submitted job 2 (seed)" in second.stdout
    assert "note: job 1 (seed) was queued from the same" in second.stderr
    assert "`orch cancel 2` if that was a slip" in second.stderr

    job.write_text('name = "seed"\ngpus = 0\ncommand = ["true", "--seed", "2"]\n')  # changed: no note
    third = orch(home, "submit", str(job), cwd=tmp_path)
    assert third.returncode == 0 and "second copy" not in third.stderr, third.stderr


def test_a_semicolon_separated_csv_is_named_as_such(tmp_path: Path):
    (tmp_path / "train.csv").write_text("text;label\nthe film is great;1\nawful;0\n")
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "lm"\ngpus = 0\n[model]\nname_or_path = "gpt2"\ntask = "causal-lm"\n'
        '[data]\ntrain = "./train.csv"\ntext_field = "text"\n'
    )
    out = orch(tmp_path / "home", "submit", str(job), cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    line = next(line for line in out.stderr.splitlines() if "'text'" in line)
    assert "text;label" in line and "it looks ';'-separated" in line, out.stderr


def test_the_preflight_names_a_semicolon_separated_csv_for_a_classifier(tmp_path: Path):
    """The classifier's fields are checked by the pre-flight on the sampled rows (training/ahead/):
    a ';'-separated file gives one column named "text;label", and the problem says why."""
    (tmp_path / "train.csv").write_text("text;label\nthe film is great;1\nawful;0\n")
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "cls"\ngpus = 0\n[model]\nname_or_path = "bert-base-uncased"\nnum_labels = 2\n'
        '[data]\ntrain = "./train.csv"\ntext_field = "text"\nlabel_field = "label"\n'
    )
    out = orch(tmp_path / "home", "submit", str(job), cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    line = next(line for line in out.stderr.splitlines() if "has no 'text'" in line)
    assert "it has: text;label" in line and "it looks ';'-separated" in line, out.stderr
