"""The Slurm step's old address: a batch script queued before the executors were grouped
(`python -m orchestrator.executors.slurm_step ...`) still starts after an upgrade. New scripts name
executors/slurm/step.py."""

import sys

from .slurm.step import main

if __name__ == "__main__":
    sys.exit(main())
