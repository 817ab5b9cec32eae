"""`python -m training.run RUN_DIR [--progress]` (its door: training/run.py): the built-in fine-tune. Reads RUN_DIR/job.toml,
trains with Lightning, writes result.json and model/, and exits with the contract's codes:
0 success, 75 checkpointed on SIGTERM, 76 out of GPU memory (smaller batch recorded), 78 a data or
configuration error (job_error.json says which; never retried), 1 failure."""

from __future__ import annotations

import sys

from training.exits import (
    EARLY_MESSAGE,
    EX_CHECKPOINTED,
    EX_CONFIG,
    EX_FAIL,
    ConfigError,
    EarlyStop,
    RunError,
    install_early_sigterm,
)

import argparse
import os
import subprocess
import traceback
from pathlib import Path
from typing import Optional


def main(run_dir: str | Path, *, progress: bool = False) -> int:
    """Run the job in RUN_DIR in this process and return its exit code. The CLI's `orch run`
    calls this; a multi-GPU job is re-run as `python -m training.run` (DDP re-launches argv)."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    saved_env = dict(os.environ)  # run_job sets ORCH_* and [env]; an in-process caller gets its own back
    install_early_sigterm()
    run_dir = Path(run_dir).resolve()
    try:
        from training.builtin.job import ddp_needs_subprocess, run_job

        if ddp_needs_subprocess(run_dir):
            cmd = [sys.executable, "-m", "training.run", str(run_dir)] + (["--progress"] if progress else [])
            return subprocess.call(cmd, cwd=str(Path(__file__).resolve().parents[2]))
        return run_job(run_dir, progress=progress)
    except EarlyStop:
        print(EARLY_MESSAGE, file=sys.stderr, flush=True)
        return EX_CHECKPOINTED
    except KeyboardInterrupt:
        print("[orch] interrupted", file=sys.stderr, flush=True)
        return 130
    except ConfigError as exc:
        return config_error(run_dir, str(exc))
    except RunError as exc:
        print(f"orch: job failed: {exc}", file=sys.stderr, flush=True)
        return EX_FAIL
    except Exception as exc:
        from orchestrator.spec.jobspec import SpecError  # what load_resolved raises (part of its interface)

        if isinstance(exc, SpecError):
            return config_error(run_dir, f"bad job.toml: {exc}")
        traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"orch: job failed: {type(exc).__name__}: {first}", file=sys.stderr, flush=True)
        return EX_FAIL
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.environ.clear()
        os.environ.update(saved_env)


def config_error(run_dir: Path, message: str) -> int:
    """A deterministic error: job_error.json (the daemon fails the job at once with this message,
    no retry) and exit 78. The message also ends the log, as every failure's does."""
    from orchestrator.contract import ENV_ATTEMPT, JOB_ERROR, write_json_atomic

    print(f"orch: job failed: {message}", file=sys.stderr, flush=True)
    attempt = os.environ.get(ENV_ATTEMPT, "")
    try:
        write_json_atomic(
            run_dir / JOB_ERROR, {"attempt": int(attempt) if attempt.isdigit() else None, "message": message}
        )
    except OSError as exc:  # no record: the daemon sees a plain failure and retries, which is safe
        print(f"orch: cannot write {JOB_ERROR}: {exc}", file=sys.stderr, flush=True)
        return EX_FAIL
    return EX_CONFIG


def cli(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.run", description=__doc__)
    parser.add_argument("run_dir", help="the job's run folder (holds job.toml)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar (foreground runs)")
    args = parser.parse_args(argv)
    return main(args.run_dir, progress=args.progress)
