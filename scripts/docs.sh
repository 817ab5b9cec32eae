#!/usr/bin/env bash
# Build the documentation site strictly (any warning, a broken link or anchor included, fails it)
# into a temporary folder, or into DIR when given. Installs the `docs` extra if mkdocs is missing.
#   bash scripts/docs.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "${ORCH_VENV:-.venv}/bin/python" ]; then
  . "${ORCH_VENV:-.venv}/bin/activate"
fi
PY=${PYTHON:-python}
if ! "$PY" -c "import mkdocs, material" >/dev/null 2>&1; then
  echo "installing the docs extra (mkdocs, mkdocs-material) ..."
  "$PY" -m pip install -q -e ".[docs]" 2>&1 | grep -v -i "warning" || true
fi
out=${1:-}
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/orch-site.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --clean --site-dir "$out"
echo "docs: the site builds with --strict${1:+ (in $out)}"
