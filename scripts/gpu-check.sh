#!/usr/bin/env bash
# One run that proves orch's GPU paths, offline, on one GPU, in under 8 minutes:
#
#   bash scripts/gpu-check.sh OUT                 # on a GPU machine
#   bash scripts/gpu-check.sh --cpu OUT           # the CPU rehearsal (CI), tiny sizes
#   bash scripts/gpu-check.sh [--only a,c] [--budget-s 450] [--keep] [--work DIR] OUT
#
# Writes OUT/report.json, OUT/summary.md and OUT/logs.tar.gz; exits 1 if a section failed, 2 on
# bad usage or a missing dependency. See docs/gpu-check.md for what each figure means.
#
# Dependencies: the machine's own python3 with torch, Lightning and transformers is used as it is,
# never replaced. If wheels/ (from scripts/fetch-wheels.sh) is here, the wheels this machine lacks
# (pydantic, datasets, APScheduler, torchdata, ...) are installed into .gpucheck-site/ with
# `pip install --no-index --no-deps --target` and put first on PYTHONPATH; nothing is downloaded.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PY=${PYTHON:-python3}
WHEELS=${GPUCHECK_WHEELS:-$ROOT/wheels}
SITE=${GPUCHECK_SITE:-$ROOT/.gpucheck-site}

if [ "$#" -eq 0 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  [ "$#" -eq 0 ] && exit 2 || exit 0
fi

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G "$WHEELS/*.whl" > /dev/null; then
  # the planner runs on the machine's own packages (PYTHONPATH without the private folder)
  "$PY" -m tools.gpucheck.wheels install "$WHEELS" "$SITE"
  export PYTHONPATH="$SITE:$PYTHONPATH" GPUCHECK_WHEELS_PLAN="$SITE/gpucheck-wheels.json"
fi

# python -m tools.gpucheck first imports what it needs and exits 2 naming what does not import
# (tools/gpucheck/deps.py), in the one interpreter that then runs the sections.
exec "$PY" -m tools.gpucheck "$@"
