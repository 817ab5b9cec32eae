"""The Ray step's old address: a Ray job submitted before the executors were grouped
(`python -m orchestrator.executors.ray_step ...`) still starts after an upgrade. New jobs name
executors/ray/step.py."""

import sys

from .ray.step import main

if __name__ == "__main__":
    sys.exit(main())
