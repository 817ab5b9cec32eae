#!/usr/bin/env bash
# System packages some tests need (a private Slurm, a headless browser, ...), from Debian.
# Each scripts/system-deps.d/*.sh names its packages with `want PKG...`; they are installed in one
# apt-get call. Runs only as root (CI and these dev machines); elsewhere the tests that need a
# package skip with a reason that names it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: not root or no apt-get; tests that need system packages will skip" >&2
  exit 0
fi
wanted=()
want() { for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || wanted+=("$p"); done; }
for part in scripts/system-deps.d/*.sh; do
  [ -e "$part" ] || continue
  # shellcheck source=/dev/null
  . "$part"
done
if [ "${#wanted[@]}" -gt 0 ]; then
  echo "system-deps: installing ${wanted[*]} ..."
  export DEBIAN_FRONTEND=noninteractive
  # A failed install is not a failed test run: the tests that need a package skip and name it.
  if ! { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null; }; then
    echo "system-deps: could not install ${wanted[*]}; the tests that need them will skip" >&2
  fi
fi
