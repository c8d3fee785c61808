#!/usr/bin/env bash
# Runs the fuzz targets of a -DDSERVE_FUZZ=ON build (make build-fuzz), one at a time.
#
#   run_fuzz.sh check BUILD SECONDS
#       for `make test`: replays every input of fuzz/corpus/<target> (seeds and regression
#       cases), then fuzzes each target for SECONDS from them into a scratch corpus.
#   run_fuzz.sh fuzz BUILD SECONDS CORPUS_ROOT [TARGET...]
#       for `make fuzz`: fuzzes each target (all when none are named) for SECONDS,
#       growing CORPUS_ROOT/<target> from the seeds.
#
# An input that runs longer than a second is a hang; leaks are findings too. A crash,
# hang or leak stops the run with the input saved under
# ${DSERVE_CACHE:-$HOME/.cache/dserve}/fuzz/artifacts/<target>/ (keep it as
# fuzz/corpus/<target>/regress-<what> once fixed).
set -euo pipefail

mode=$1 build=$2 seconds=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
cache=${DSERVE_CACHE:-$HOME/.cache/dserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# Targets whose readers take a path write each input to a file: in memory when possible,
# in a directory of the run's own, removed at the end even after a crash.
tmp_root=${TMPDIR:-/tmp}
if [[ -d /dev/shm && -w /dev/shm ]]; then tmp_root=/dev/shm; fi
export TMPDIR=$(mktemp -d "$tmp_root/dserve-fuzz.XXXXXX")
trap 'rm -rf "$TMPDIR"' EXIT

targets=()
for dir in "$here"/corpus/*/; do targets+=("$(basename "$dir")"); done
if [[ $mode == fuzz && $# -gt 1 ]]; then targets=("${@:2}"); fi

flags=(-timeout=1 -rss_limit_mb=2048 -print_final_stats=1)
for t in "${targets[@]}"; do
  bin=$build/fuzz/fuzz_$t
  seeds=$here/corpus/$t
  [[ -x $bin ]] || { echo "run_fuzz.sh: $bin is missing (make build-fuzz)" >&2; exit 1; }
  artifacts=$cache/fuzz/artifacts/$t/
  mkdir -p "$artifacts"
  log=$(mktemp)
  case $mode in
    check)
      scratch=$(mktemp -d)
      ok=1
      "$bin" "${flags[@]}" -runs=0 -artifact_prefix="$artifacts" "$seeds" >"$log" 2>&1 &&
        "$bin" "${flags[@]}" -max_total_time="$seconds" -artifact_prefix="$artifacts" \
          "$scratch" "$seeds" >>"$log" 2>&1 || ok=0
      rm -rf "$scratch"
      ;;
    fuzz)
      corpus=$1/$t
      mkdir -p "$corpus"
      ok=1
      "$bin" "${flags[@]}" -max_total_time="$seconds" -artifact_prefix="$artifacts" \
        "$corpus" "$seeds" >"$log" 2>&1 || ok=0
      ;;
    *) echo "run_fuzz.sh: unknown mode $mode" >&2; exit 2 ;;
  esac
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [[ $ok == 1 ]]; then
    echo "fuzz_$t: ok (${runs:-?} runs, ${cov:-cov: ?})"
    rm -f "$log"
  else
    echo "fuzz_$t: FAILED; its output:" >&2
    tail -60 "$log" >&2
    rm -f "$log"
    exit 1
  fi
done
