#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, slow tests included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ORCH_EXTRAS="${ORCH_EXTRAS:-test,docs}" bash scripts/setup.sh
bash scripts/system-deps.sh
. "${ORCH_VENV:-.venv}/bin/activate"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
bash scripts/lint.sh  # import rules, lint, format, types: a violation fails before any test runs
bash scripts/build-dist.sh  # the sdist and wheel users install (tests/repo/test_wheel.py installs one)
rc=0
# Two workers (pytest-xdist); tests/conftest.py keeps together what must share one (a file's
# reference runs, a per-host Slurm or Ray cluster) and starts the longest groups first.
# ORCH_TEST_WORKERS=0 runs the suite in this one process.
python -m pytest -q -ra --durations=15 -n "${ORCH_TEST_WORKERS:-2}" --dist loadgroup "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
