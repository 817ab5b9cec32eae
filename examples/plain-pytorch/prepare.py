"""Make this example's data and tiny model (no download, deterministic, idempotent) — the same as
the Trainer example's — next to this file, or in the folder given:

    python examples/plain-pytorch/prepare.py && orch submit examples/plain-pytorch/job.toml
"""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.argv[1:] = sys.argv[1:] or [str(HERE)]
runpy.run_path(str(HERE.parent / "hf-trainer" / "prepare.py"), run_name="__main__")
