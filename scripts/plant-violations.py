"""Show that every import-linter contract can fail: for each, copy the tree to a temporary folder,
plant one import that breaks it, run lint-imports there, and report whether that contract (and only
it, ideally) broke. Run by hand: `python scripts/plant-violations.py` (about a minute)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# contract id -> (file to plant in, the line planted, the contract's name as lint-imports prints it)
PLANTS = {
    "layers": ("orchestrator/host/gpus.py", "from ..spec import bounds  # planted", "The core's floors"),
    "cli-light": ("orchestrator/cli/doctor.py", "from ..daemon import tick  # planted", "The CLI reaches the daemon"),
    "training-layers": ("training/resume/rng.py", "from training.builtin import rows  # planted", "training's floors"),
    "acyclic": ("orchestrator/spec/bounds.py", "from . import config  # planted", "No import circle"),
    "light-core": ("orchestrator/views/render.py", "import torch  # planted", "never import the training stack"),
    "optuna-in-sweeps-only": ("orchestrator/sweeps/summary.py", "import optuna  # planted", "Only the sweep study"),
    "training-sees-the-contract": (
        "training/ahead/probe.py",
        "import orchestrator.store  # planted",
        "training imports only",
    ),
    "notifiers-vocabulary": (
        "notifiers/email.py",
        "import orchestrator.home.paths  # planted",
        "notifiers import only",
    ),
    "store-inside": ("orchestrator/jobs/lifecycle.py", "from ..store import connection  # planted", "store's insides"),
    "executors-inside": (
        "orchestrator/daemon/reap.py",
        "from ..executors import local  # planted",
        "executors' implementations",
    ),
}


def run(tree: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(["lint-imports", "--no-cache"], cwd=tree, env=env, capture_output=True, text=True)
    return out.stdout + out.stderr


def broken(output: str) -> list[str]:
    lines = [line for line in output.splitlines() if line.rstrip().endswith(("BROKEN", "KEPT"))]
    text = "\n".join(output.splitlines())
    return [name for _, (_, _, name) in PLANTS.items() if f"{name}" in text and _is_broken(text, name)] if lines else []


def _is_broken(text: str, name: str) -> bool:
    # the summary line of a contract ends with KEPT or BROKEN, possibly two lines after its name
    i = text.find(name)
    tail = text[i : i + 400]
    k, b = tail.find("KEPT"), tail.find("BROKEN")
    return b != -1 and (k == -1 or b < k)


def main() -> int:
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for cid, (rel, line, name) in PLANTS.items():
            tree = Path(tmp) / cid
            shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv", "site", "__pycache__"))
            path = tree / rel
            text = path.read_text()
            head, sep, rest = text.partition("\nfrom __future__ import annotations\n")
            path.write_text(head + sep + line + "\n" + rest if sep else line + "\n" + text)
            got = broken(run(tree))
            hit = name in got
            ok &= hit
            rows.append(
                f"| {cid} | `{rel}`: `{line.split('  #')[0]}` | {'BROKEN' if hit else 'kept (!)'} | {', '.join(g for g in got if g != name) or '-'} |"
            )
    print("| contract | planted import | that contract | others broken |\n|---|---|---|---|")
    print("\n".join(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
