"""The frame of the GPU check: sizes per mode, the per-section record (checks, figures,
pass/fail/skipped with a reason), job processes in their own sessions, and the context a section
gets (work folder, models, job.toml, environment, the time budget)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional
from orchestrator.contract import read_json  # noqa: F401  (the sections import it from here)

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sizes:
    mode: str  # "gpu" or "cpu"
    model: str  # assets.SHAPES key for sections a-d and f
    large: str  # the notice-checkpoint model (e)
    seq: int
    row_words: int  # words per training row (0: one toy sentence, about 12 tokens)
    batch: int
    steps: int
    lr: float
    workers: int
    precisions: tuple[str, ...]
    throughput_precision: str  # b compares at this precision (a's run at it is the first runner sample)
    plain_runs: int
    extra_runner_runs: int
    oom_seq: int
    oom_cpu_batch: int  # --cpu only: the batch that "overflows" (the simulated OOM)
    resume_steps: int
    resume_batch: int
    resume_precision: str
    resume_arms: tuple[bool, ...]  # d: `deterministic` of each interrupted-vs-uninterrupted pair
    notice_batch: int
    notice_seq: int
    notice_precision: str
    daemon_steps: int
    budget_s: float
    goal_throughput: float = 0.98
    goal_notice_ratio: float = 1.5
    goal_daemon_gap_s: float = 3.0


GPU = Sizes(
    mode="gpu",
    model="base",
    large="large",
    seq=128,
    row_words=136,
    batch=32,
    steps=300,
    lr=1e-4,
    workers=4,
    precisions=("16-mixed", "bf16-mixed"),
    throughput_precision="bf16-mixed",
    plain_runs=2,
    extra_runner_runs=1,
    oom_seq=512,
    oom_cpu_batch=0,
    resume_steps=60,
    resume_batch=16,
    resume_precision="16-mixed",
    resume_arms=(True, False),
    notice_batch=8,
    notice_seq=128,
    notice_precision="bf16-mixed",
    daemon_steps=30,
    budget_s=450,
)
CPU = Sizes(
    mode="cpu",
    model="tiny",
    large="tiny",
    seq=32,
    row_words=0,
    batch=16,
    steps=40,
    lr=1e-2,
    workers=0,
    precisions=("16-mixed", "bf16-mixed"),
    throughput_precision="16-mixed",
    plain_runs=1,
    extra_runner_runs=0,
    oom_seq=32,
    oom_cpu_batch=8,
    resume_steps=24,
    resume_batch=8,
    resume_precision="32",
    resume_arms=(True,),  # on one CPU thread a job is deterministic either way: nothing more to see
    notice_batch=8,
    notice_seq=32,
    notice_precision="32",
    daemon_steps=8,
    budget_s=600,
)


class Skip(Exception):
    """Raised by a section: skipped, with the reason as its message."""


@dataclass
class Section:
    key: str
    letter: str
    title: str
    status: str = "pass"  # pass | fail | skipped
    reason: str = ""
    headline: str = ""
    wall_s: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        if ok and len(detail) > 200:
            detail = ""  # a passing check's long detail (a log tail) is noise; the logs are in logs.tar.gz
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        return bool(ok)

    def require(self, name: str, ok: bool, detail: str = "") -> None:
        """A check the rest of the section depends on: stop the section when it fails."""
        if not self.check(name, ok, detail):
            raise StopSection()

    def settle(self) -> None:
        if self.status == "skipped":
            return
        failed = [c["name"] for c in self.checks if not c["ok"]]
        if failed:
            self.status = "fail"
            self.reason = self.reason or "failed: " + "; ".join(failed)
        elif not self.checks:
            self.status = "fail"
            self.reason = self.reason or "no check ran"


class StopSection(Exception):
    pass


class Proc:
    """A job-side process in its own session, output to a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path = REPO):
        self.log = log
        self.argv = argv
        log.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(log, "ab")
        self.launched = time.time()
        self.proc = subprocess.Popen(
            argv,
            cwd=str(cwd),
            env=env,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> Optional[int]:
        """The exit code, or None after killing the group when `timeout` ran out."""
        try:
            code = self.proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self._fh.close()
        return code

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 12) -> str:
        return "\n".join(self.output().strip().splitlines()[-n:])


class Ctx:
    def __init__(self, sizes: Sizes, out: Path, work: Path, deadline: float):
        self.sizes = sizes
        self.out = out
        self.work = work
        self.deadline = deadline
        self.procs: list[Proc] = []
        self.shared: dict[str, Any] = {}
        self._models: dict[str, Path] = {}
        base = {k: v for k, v in os.environ.items() if not (k.startswith("ORCH_") or k.startswith("GPUCHECK_NOTICE"))}
        base.update(
            {
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_CACHE": str(work / "hf-datasets-cache"),
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
            }
        )
        if sizes.mode == "cpu":
            # A tiny model gains nothing from a second thread, and on shared cores OpenMP's spinning
            # threads make each step many times slower (40 steps: 29 s vs 1.4 s on a loaded machine).
            base.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        self.base_env = base

    @property
    def gpu(self) -> bool:
        return self.sizes.mode == "gpu"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self, wanted: float) -> float:
        """A subprocess timeout: what the step may need, capped by the time budget left (+ a margin)."""
        return max(5.0, min(wanted, self.left() + 15.0))

    def model(self, shape: str, max_positions: int = 512) -> Path:
        key = f"{shape}-{max_positions}"
        if key not in self._models:
            from .assets import build_model

            self._models[key] = build_model(self.work / "models" / key, shape, max_positions=max_positions)
        return self._models[key]

    def env(self, run_dir: Optional[Path] = None, attempt: int = 1, **extra: str) -> dict[str, str]:
        env = dict(self.base_env)
        if run_dir is not None:
            env.update(
                {
                    "ORCH_RUN_DIR": str(run_dir),
                    "ORCH_CKPT_DIR": str(run_dir / "checkpoints"),
                    "ORCH_JOB_ID": run_dir.name,
                    "ORCH_ATTEMPT": str(attempt),
                }
            )
        env.update(extra)
        return env

    def write_job(
        self,
        run_dir: Path,
        *,
        model: Path,
        train: Path,
        seq: int,
        batch: int,
        precision: str,
        lr: float,
        steps: Optional[int] = None,
        epochs: int = 1,
        accumulate: int = 1,
        deterministic: bool = False,
        every_n_steps: Optional[int] = None,
        keep: int = 2,
        shuffle: bool = True,
        workers: Optional[int] = None,
        seed: int = 7,
        name: str = "gpucheck",
    ) -> Path:
        import tomli_w

        from orchestrator.spec.jobspec import JobSpec

        train_section: dict[str, Any] = {
            "max_epochs": epochs,
            "batch_size": batch,
            "precision": precision,
            "learning_rate": lr,
            "seed": seed,
            "deterministic": deterministic,
            "accumulate_grad_batches": accumulate,
        }
        if steps:
            train_section["max_steps"] = steps
        raw = {
            "name": name,
            "gpus": 1 if self.gpu else 0,
            "retries": 0,
            "model": {"name_or_path": str(model), "num_labels": 2},
            "data": {
                "train": str(train),
                "max_length": seq,
                "shuffle": shuffle,
                "num_workers": self.sizes.workers if workers is None else workers,
            },
            "train": train_section,
            "checkpoint": {"every_n_steps": every_n_steps, "every_minutes": 100_000.0, "keep": keep},
        }
        if every_n_steps is None:
            del raw["checkpoint"]["every_n_steps"]
        spec = JobSpec.model_validate(raw)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "job.toml"
        path.write_bytes(tomli_w.dumps(spec.to_toml_dict()).encode())
        return path

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> Proc:
        proc = Proc(argv, env, log)
        self.procs.append(proc)
        return proc

    def start_job(self, run_dir: Path, *, attempt: int = 1, wrap: Optional[list[str]] = None, **env: str) -> Proc:
        """`python -m training.run RUN_DIR`, as orch starts it; with `wrap`, the instrumented
        tools.gpucheck.jobwrap with those options."""
        module = (
            ["-m", "tools.gpucheck.jobwrap", str(run_dir), *wrap]
            if wrap is not None
            else ["-m", "training.run", str(run_dir)]
        )
        return self.start(
            [sys.executable, *module], self.env(run_dir, attempt, **env), run_dir / f"attempt-{attempt}.log"
        )

    def run_job(
        self, run_dir: Path, *, timeout: float, attempt: int = 1, wrap: Optional[list[str]] = None, **env: str
    ) -> tuple[Optional[int], Proc]:
        proc = self.start_job(run_dir, attempt=attempt, wrap=wrap, **env)
        return proc.wait(self.timeout(timeout)), proc

    def run_jobs(
        self, jobs: dict[str, tuple[Path, Optional[list[str]]]], *, timeout: float, side_by_side: bool
    ) -> dict[str, tuple[Optional[int], Proc]]:
        """run_job for each (run folder, wrap) in `jobs`: one after the other, or all started at
        once and then waited for."""
        if not side_by_side:
            return {key: self.run_job(run, timeout=timeout, wrap=wrap) for key, (run, wrap) in jobs.items()}
        procs = {key: self.start_job(run, wrap=wrap) for key, (run, wrap) in jobs.items()}
        return {key: (proc.wait(self.timeout(timeout)), proc) for key, proc in procs.items()}

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.kill()


def run_here(func: Callable[[], int], log: Path, *, threads: Optional[int] = None) -> int:
    """func() in this process with its output (fds 1 and 2, so C and logging output too) appended
    to `log`, as a Proc's would be: its return value, or 1 with the traceback in the log. threads:
    torch's intra-op threads while it runs (as OMP_NUM_THREADS in a job process)."""
    import traceback

    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    before = None
    with open(log, "ab") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            if threads:
                import torch

                before = torch.get_num_threads()
                torch.set_num_threads(threads)
            return func()
        except Exception:
            traceback.print_exc()
            return 1
        finally:
            if before:
                import torch

                torch.set_num_threads(before)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def tail(log: Path, n: int = 12) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def free_run(run_dir: Path) -> None:
    """Drop a finished run's checkpoints and exported model (GBs for BERT-large)."""
    for sub in ("checkpoints", "model", "bare"):
        shutil.rmtree(run_dir / sub, ignore_errors=True)
