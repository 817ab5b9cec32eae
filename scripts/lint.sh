#!/usr/bin/env bash
# The code checks CI runs before the tests (configured in pyproject.toml): the import rules
# (import-linter), lint and format (ruff), types (mypy on orchestrator/ and notifiers/).
# Runs every check and fails if any failed. Needs the `test` extra installed.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
run() {
  echo "== $*"
  "$@" || failed+=("$1")
}
run lint-imports
run ruff check --output-format concise .
run ruff format --check --output-format concise .
run mypy
if [ "${#failed[@]}" -gt 0 ]; then
  echo "code checks failed: ${failed[*]}" >&2
  exit 1
fi
echo "code checks passed"
