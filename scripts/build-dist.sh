#!/usr/bin/env bash
# Build the package as users install it: the sdist, then the wheel from that sdist (so a file the
# sdist forgets is missing from the wheel too), into dist/ (or $1). Then check that the wheel
# carries the `orch` command, the three packages, the dashboard's page and the examples.
# No build isolation: the venv's setuptools builds it, offline (CI has no index to fetch one from).
# The Python: $PYTHON, else the active virtualenv's, else the project's own .venv (scripts/setup.sh
# makes it), so the script works whether or not .venv is activated.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-dist}"
VENV="${ORCH_VENV:-.venv}"
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PY="$VIRTUAL_ENV/bin/python"
elif [ -x "$VENV/bin/python" ]; then
  PY="$VENV/bin/python"
else
  PY="python3"
fi
if ! "$PY" -c "import build, setuptools" >/dev/null 2>&1; then
  echo "build-dist: $PY cannot build the package (no 'build' or 'setuptools' module)." >&2
  echo "  run 'bash scripts/setup.sh' first (it makes $VENV with both; this script then uses it)," >&2
  echo "  or name a Python that has them: PYTHON=/path/to/python bash scripts/build-dist.sh" >&2
  exit 2
fi
rm -rf "$out" build
"$PY" -m build --no-isolation --outdir "$out" . >/dev/null
"$PY" - "$out" <<'PYEOF'
import sys, zipfile
from pathlib import Path

out = Path(sys.argv[1])
wheels, sdists = sorted(out.glob("orch_gpu-*.whl")), sorted(out.glob("orch_gpu-*.tar.gz"))
if len(wheels) != 1 or len(sdists) != 1:
    sys.exit(f"build-dist: expected one wheel and one sdist in {out}, found {[p.name for p in out.iterdir()]}")
names = set(zipfile.ZipFile(wheels[0]).namelist())
needed = ["orchestrator/cli/__init__.py", "training/run.py", "training/builtin/run.py",
          "training/builtin/tasks/lora.py", "training/resume/checkpoints.py", "notifiers/base.py",
          "orchestrator/dashboard/static/index.html", "/share/orch-gpu/examples/quickstart/job.toml",
          "/share/orch-gpu/examples/hf-trainer/train.py", "entry_points.txt"]
missing = [n for n in needed if not any(name.endswith(n) for name in names)]
if missing:
    sys.exit(f"build-dist: {wheels[0].name} lacks {missing}")
entry = next(n for n in names if n.endswith("entry_points.txt"))
if "orch = orchestrator.cli:main" not in zipfile.ZipFile(wheels[0]).read(entry).decode():
    sys.exit("build-dist: the wheel has no `orch` command")
print(f"built {sdists[0]} and {wheels[0]} ({wheels[0].stat().st_size // 1024} KiB, {len(names)} files)")
PYEOF
