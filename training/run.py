"""`python -m training.run RUN_DIR [--progress]`: the built-in fine-tune. Reads RUN_DIR/job.toml,
trains with Lightning, writes result.json and model/, and exits with the contract's codes:
0 success, 75 checkpointed on SIGTERM, 76 out of GPU memory (smaller batch recorded), 78 a data or
configuration error (job_error.json says which; never retried), 1 failure. The door only: the body
is training/builtin/run.py."""

from __future__ import annotations

import sys

from training.exits import install_early_sigterm

# Installed before the heavy imports: they take seconds, and a default SIGTERM would exit -15.
if __name__ == "__main__":
    import training.exits

    training.exits.EXIT_AT_ONCE = True
    install_early_sigterm()
    import faulthandler
    import signal as _signal

    # The daemon's hang watchdog sends SIGUSR1: every thread's Python stack goes to stderr (the log).
    faulthandler.register(_signal.SIGUSR1, all_threads=True, chain=False)

from training.builtin.run import cli, config_error, main  # noqa: E402

__all__ = ["cli", "config_error", "main"]


if __name__ == "__main__":
    code = cli()
    # The exit code is decided. A SIGTERM from here on (srun stopping the other ranks once rank 0
    # exits 75, a second preemption signal) must not turn it into a death by signal: the
    # interpreter resets Python handlers to the default while it shuts down, but keeps SIG_IGN.
    import signal as _signal

    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
