#!/usr/bin/env bash
# The quickstart, end to end on a fresh machine: set up, make the example's data and tiny BERT
# (no download), start the daemon, submit the job, follow its log to the end, and say where the
# model and metrics are. State goes to $ORCH_HOME (default: ./.orch in this checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${ORCH_VENV:-.venv}/bin/activate"
export ORCH_HOME="${ORCH_HOME:-$PWD/.orch}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

python examples/quickstart/prepare.py

started_daemon=0
if ! orch daemon status >/dev/null 2>&1; then
  orch daemon start
  started_daemon=1
fi
cleanup() { if [ "$started_daemon" = 1 ]; then orch daemon stop >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT

id=$(orch submit --json examples/quickstart/job.toml | python -c 'import json, sys; print(json.load(sys.stdin)["id"])')
echo "submitted job $id; following its log (Ctrl-C stops following, not the job)"
orch logs -f "$id" || true
orch show "$id"
state=$(orch show --json "$id" | python -c 'import json, sys; print(json.load(sys.stdin)["state"])')
run_dir="$ORCH_HOME/runs/$id"
echo
echo "job $id: $state"
echo "  model (from_pretrained layout): $run_dir/model"
echo "  result and metrics:             $run_dir/result.json, $run_dir/metrics.csv"
[ "$state" = "succeeded" ]
