#!/usr/bin/env bash
# Prints the path of a venv holding ais-bench (`ais_bench`), creating it first if needed.
#
# The venv lives outside the repository, in $DSERVE_CACHE/aisbench/venv-KEY (default
# cache ~/.cache/dserve), KEY a hash of the pins in tools/aisbench-requirements.txt (its
# lines other than comments) and of the Python version: a changed pin list gets a new
# venv, an unchanged one is reused. Creating it downloads ais-bench and its dependencies
# (torch among them) from PyPI: a few minutes.
# Concurrent callers wait on a lock; an interrupted creation is started over.
#
#   venv=$(tools/aisbench_env.sh) && "$venv/bin/ais_bench" --help
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
requirements=$repo/tools/aisbench-requirements.txt
python=${PYTHON:-python3}
cache=${DSERVE_CACHE:-$HOME/.cache/dserve}/aisbench
key=$( { grep -v '^#' "$requirements"; "$python" --version; } | sha256sum | cut -c1-16)
venv=$cache/venv-$key

mkdir -p "$cache"
exec 9>"$cache/venv-$key.lock"
flock 9
if [ ! -e "$venv/.complete" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # torch alone first, as the test venv does: where a local CPU build of this version
  # is on pip's path, it is the one taken.
  "$venv/bin/pip" install -q "$(grep -m1 '^torch==' "$requirements")" >&2
  "$venv/bin/pip" install -q -r "$requirements" >&2
  "$venv/bin/ais_bench" --help >/dev/null
  touch "$venv/.complete"
fi
echo "$venv"
