#!/usr/bin/env bash
# Run the suite's historically racy files several times with the cores busy: a race that a quiet
# machine hides (a sleep that happened to be long enough, a poll that happened to come first) shows
# up when every core is taken. Run it before every stop that touches the daemon, the mirror or the
# executors (docs/development.md).
#
#   bash scripts/stress.sh              # each racy file 3 times, one CPU burner per core beside them
#   ROUNDS=5 BURNERS=4 bash scripts/stress.sh tests/daemon/test_daemon_queue.py   # other files, more rounds
#
# It stops at the first failure and says which round; the burners are stopped whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
. "${ORCH_VENV:-.venv}/bin/activate"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

ROUNDS="${ROUNDS:-3}"
BURNERS="${BURNERS:-$(nproc)}"
# The files whose tests once passed by timing alone (issue 44's list, and the landings that needed
# several CI tries): the daemon's ticks, Slurm's polls, the mirror, orch watch, a full disk, notices.
RACY=(
  tests/daemon/test_daemon_recovery.py
  tests/daemon/test_full_disk.py
  tests/daemon/test_notice_during_start.py
  tests/executors/test_ray_silent_head.py
  tests/jobs/test_absent_gpus.py
  tests/slurm/test_slurm_commands.py
  tests/slurm/test_slurm_cost.py
  tests/mirror/test_mirror_daemon.py
  tests/mirror/test_recovery_e2e.py
  tests/mirror/test_teardown_e2e.py
  tests/mirror/test_adopt_wait.py
)
files=("$@")
[ "${#files[@]}" -gt 0 ] || files=("${RACY[@]}")

burners=()
stop_burners() {
  for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_burners EXIT
for _ in $(seq "$BURNERS"); do
  python -c "while True: pass" &
  burners+=("$!")
done
echo "stress: ${#files[@]} file(s) x $ROUNDS round(s) beside $BURNERS CPU burner(s)"
for round in $(seq "$ROUNDS"); do
  echo "== round $round of $ROUNDS"
  # One pytest per folder: tests/slurm and tests/mirror each have a conftest of their own that
  # their test files import by name, so files of two such folders cannot share one process.
  for dir in $(printf '%s\n' "${files[@]}" | xargs -n1 dirname | sort -u); do
    mine=()
    for f in "${files[@]}"; do [ "$(dirname "$f")" = "$dir" ] && mine+=("$f"); done
    if ! python -m pytest -q -x -p no:randomly -n 0 "${mine[@]}"; then
      echo "stress: failed in round $round of $ROUNDS, in $dir (the output above says which test)" >&2
      exit 1
    fi
  done
done
echo "stress: $ROUNDS round(s) passed"
