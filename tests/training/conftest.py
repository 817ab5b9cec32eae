"""Fixtures for the job side: a tiny BERT + WordPiece tokenizer built locally, small sentiment
datasets, run folders with a resolved job.toml, and helpers that run `python -m training.run`
as a real subprocess (real signals, real exit codes)."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import tomli_w

from orchestrator.spec.jobspec import JobSpec
from daemon_harness import wait_for  # noqa: F401  (the one wait_for; tests here import it from conftest)
from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch (OpenMP) thread for what trains here, in this process and in the jobs it starts
    (they inherit the environment). On two cores shared with another test worker, a second thread
    spin-waits for a core it seldom gets: a tiny BERT's step measured 0.08 s with one thread and
    0.85 s (13x the CPU) with two on a busy machine. Thread count is not what these tests test, but
    a run compared with another must use the same count: module-scoped (and autouse, so set up
    first), a module's shared reference runs get it too. Put back after each module."""
    import torch

    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        patch.setenv("MKL_NUM_THREADS", "1")
        torch.set_num_threads(1)
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf-datasets-cache")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """train.jsonl (640 rows), dev.jsonl (128), and string-label variants."""
    folder = tmp_path_factory.mktemp("data")
    write_jsonl(folder / "train.jsonl", sentiment_rows(640, seed=11))
    write_jsonl(folder / "dev.jsonl", sentiment_rows(128, seed=12))
    write_jsonl(folder / "train_str.jsonl", sentiment_rows(320, seed=13, string_labels=True))
    write_jsonl(folder / "dev_str.jsonl", sentiment_rows(64, seed=14, string_labels=True))
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-bert")
    texts = [r["text"] for r in sentiment_rows(2000, seed=1)]
    return build_tiny_bert(folder, texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)


def base_spec(tiny_bert: Path, data_dir: Path) -> dict[str, Any]:
    return {
        "name": "t",
        "gpus": 0,
        "model": {"name_or_path": str(tiny_bert), "num_labels": 2},
        "data": {
            "train": str(data_dir / "train.jsonl"),
            "validation": str(data_dir / "dev.jsonl"),
            "max_length": 64,
            "num_workers": 0,
        },
        "train": {"max_epochs": 2, "batch_size": 16, "precision": "32", "learning_rate": 1e-3, "seed": 7},
        "checkpoint": {"every_n_steps": 10, "keep": 2},
    }


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


@pytest.fixture
def make_run_dir(tmp_path, tiny_bert, data_dir) -> Callable[..., Path]:
    """make_run_dir(name, **section_overrides) -> a run folder holding a validated job.toml
    (written from a JobSpec, like orch does). A value of None removes a key."""

    def make(name: str = "run", **overrides: Any) -> Path:
        raw = _merge(base_spec(tiny_bert, data_dir), overrides)
        spec = JobSpec.model_validate(raw)
        run_dir = tmp_path / name
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "job.toml").write_bytes(tomli_w.dumps(spec.to_toml_dict()).encode())
        return run_dir

    return make


def job_env(hf_cache: Path, run_dir: Path, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(hf_cache),
            "ORCH_RUN_DIR": str(run_dir),
            "ORCH_CKPT_DIR": str(run_dir / "checkpoints"),
            "ORCH_JOB_ID": "1",
            "ORCH_ATTEMPT": "1",
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",  # see one_torch_thread
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.pop("ORCH_RESUME_FROM", None)
    env.pop("ORCH_RESUME_CHECKED", None)
    env.update(extra or {})
    return env


class Job:
    """A `python -m training.run` subprocess in its own session (like the supervisor starts it)."""

    def __init__(self, run_dir: Path, env: dict[str, str], log: Path):
        self.run_dir = run_dir
        self.log = log
        self._fh = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "training.run", str(run_dir)],
            cwd=str(REPO),
            env=env,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def signal_group(self, sig: int = signal.SIGTERM) -> None:
        os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            raise AssertionError(f"job did not exit within {timeout}s; log:\n{self.output()[-3000:]}") from None
        finally:
            self._fh.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def start_job(hf_cache) -> Callable[..., Job]:
    started: list[Job] = []

    def start(run_dir: Path, attempt: int = 1, **extra_env: str) -> Job:
        env = job_env(hf_cache, run_dir, {"ORCH_ATTEMPT": str(attempt), **extra_env})
        job = Job(run_dir, env, run_dir / f"attempt-{attempt}.log")
        started.append(job)
        return job

    yield start
    for job in started:  # never leave a stray trainer running after a failed test
        if job.proc.poll() is None:
            try:
                os.killpg(job.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.proc.wait()


@pytest.fixture
def run_job(start_job) -> Callable[..., tuple[int, str]]:
    """Run one attempt to the end: (exit code, combined output)."""

    def run(run_dir: Path, attempt: int = 1, timeout: float = 300, **extra_env: str) -> tuple[int, str]:
        job = start_job(run_dir, attempt, **extra_env)
        code = job.wait(timeout)
        return code, job.output()

    return run


@pytest.fixture
def run_here(hf_cache, capfd) -> Callable[..., tuple[int, str]]:
    """Run one attempt in this process, as `orch run` does (training.run.main): (exit code, what it
    printed). The same environment as run_job's subprocess, set for the call and put back after it,
    without paying a new interpreter's imports (~10 s on a busy machine) each time. For tests where
    the trained result is the point; run_job stays for those about the process (signals, exits)."""
    from training.run import main

    def run(run_dir: Path, attempt: int = 1, **extra_env: str) -> tuple[int, str]:
        env = job_env(hf_cache, run_dir, {"ORCH_ATTEMPT": str(attempt), **extra_env})
        saved = dict(os.environ)
        capfd.readouterr()  # only this attempt's output
        os.environ.clear()
        os.environ.update(env)
        try:
            code = main(run_dir)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        captured = capfd.readouterr()
        return code, captured.out + captured.err

    return run


def read_progress(run_dir: Path) -> Optional[dict]:
    try:
        return json.loads((run_dir / "progress.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def final_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
