#!/usr/bin/env bash
# Fetch, on a machine WITH network, the wheels scripts/gpu-check.sh needs on a GPU machine that has
# none: orch's pure-Python dependencies (pydantic + pydantic-core, datasets + its helpers,
# APScheduler, torchdata, typer, click, httpx, tomli-w, ...) for CPython 3.12, manylinux x86_64.
# torch, Lightning, transformers and what they are built on are never fetched (see PROTECTED in
# tools/gpucheck/wheels.py): the GPU machine's own copies are used.
#
#   bash scripts/fetch-wheels.sh [DIR] [EXTRA_REQ ...]     # DIR defaults to wheels/ (git-ignored)
#
# The versions are the ones installed in the environment that runs this script (activate the
# project's .venv first), so the GPU machine runs what CI tested. EXTRA_REQ adds wheels the list
# leaves out on purpose, e.g. `pyarrow==26.0.1` if the GPU image's pyarrow turns out too old.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-wheels}
shift || true
PY=${PYTHON:-python3}

mkdir -p "$DIR"
REQS="$DIR/requirements.txt"
"$PY" -m tools.gpucheck.wheels requirements > "$REQS"
for extra in "$@"; do echo "$extra" >> "$REQS"; done
echo "fetching $(wc -l < "$REQS") wheels listed in $REQS into $DIR/" >&2

PLATFORMS=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" -d "$DIR" -r "$REQS"

# One version of each distribution: an older download left in DIR would make two.
"$PY" - "$DIR" <<'EOF'
import sys
from pathlib import Path
from tools.gpucheck.wheels import normalize, wheel_name_version
folder = Path(sys.argv[1])
wanted = {}
for line in (folder / "requirements.txt").read_text().split():
    name, _, version = line.partition("==")
    wanted[normalize(name)] = version
for whl in sorted(folder.glob("*.whl")):
    name, version = wheel_name_version(whl)
    if name not in wanted or wanted[name] != version:
        print(f"removing {whl.name}: not in requirements.txt at that version", file=sys.stderr)
        whl.unlink()
EOF
du -sh "$DIR" >&2
ls "$DIR"/*.whl | wc -l | xargs -I{} echo "{} wheels in $DIR/" >&2
