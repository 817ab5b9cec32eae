#!/usr/bin/env bash
# Set up a virtual environment for orch in .venv (or $ORCH_VENV) and install the project.
# torch: a torch already importable in that environment is kept (a CUDA build on a GPU image);
# otherwise torch==2.13.0 is installed first, because a plain `torch` requirement pulls a
# multi-GB CUDA build on a machine that has none.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ORCH_VENV:-.venv}"
PY="${PYTHON:-python3}"
EXTRAS="${ORCH_EXTRAS:-test}"           # scripts/test.sh adds docs (the site's build is tested)

"$PY" - <<'PYEOF'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"orch needs Python 3.10 or newer; this is {sys.version.split()[0]}")
PYEOF

if [ ! -x "$VENV/bin/python" ]; then
  # --system-site-packages on request: reuse the image's own (CUDA) torch instead of installing one.
  if [ "${ORCH_SYSTEM_TORCH:-0}" = "1" ]; then
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip 2>&1 | grep -v -i "warning" || true
if ! python -c "import torch" >/dev/null 2>&1; then
  echo "installing torch==2.13.0 ..."
  python -m pip install -q "torch==2.13.0" 2>&1 | grep -v -i "warning" || true
fi
# The distribution was called `orch` before it was renamed `orch-gpu` (that name on PyPI is another
# project): an old editable install of this checkout would shadow the new one's files and command.
if python -m pip show orch 2>/dev/null | grep -q "^Name: orch$"; then
  python -m pip uninstall -q -y orch 2>&1 | grep -v -i "warning" || true
fi
echo "installing orch and its dependencies ..."
python -m pip install -q -e ".[$EXTRAS]" 2>&1 | grep -v -i "warning" || true
python -c "import torch, pytorch_lightning, transformers, datasets, orchestrator, training, notifiers" \
  || { echo "setup failed: the packages above do not import" >&2; exit 1; }
echo "ready: . $VENV/bin/activate  (torch $(python -c 'import torch; print(torch.__version__)'))"
