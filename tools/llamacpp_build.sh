#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-batched-bench, llama-server and llama-quantize
# once, from the source inside PyPI's llama-cpp-python sdist (pinned), into the cache
# outside the repository:
#   $DSERVE_CACHE/llamacpp/<version>/build/bin/
# For side-by-side benchmarks only (make bench-compare); never part of make test.
# Built for this machine (GGML_NATIVE), as a user of llama.cpp would build it.
#   tools/llamacpp_build.sh         -> prints the bin directory
#   tools/llamacpp_build.sh --src   -> only unpacks the source (its converter); prints it
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${DSERVE_CACHE:-$HOME/.cache/dserve}
ROOT=$CACHE/llamacpp/$VERSION
PY=${PY:-.venv/bin/python}

mkdir -p "$ROOT"
SDIST=$ROOT/llama_cpp_python-$VERSION.tar.gz
if [ ! -s "$SDIST" ]; then
  # The sdist only (never --no-binary :all:, which would build cmake from source).
  "$PY" -m pip download -q --no-deps --no-binary=llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$ROOT" >&2
fi
SRC=$ROOT/src
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  rm -rf "$ROOT/unpack" && mkdir -p "$ROOT/unpack"
  tar xzf "$SDIST" -C "$ROOT/unpack"
  rm -rf "$SRC" && mv "$ROOT/unpack/llama_cpp_python-$VERSION/vendor/llama.cpp" "$SRC"
  rm -rf "$ROOT/unpack"
fi
if [ "${1:-}" = "--src" ]; then
  echo "$SRC"
  exit 0
fi
# build DIR CMAKE_FLAGS...: llama-bench, llama-batched-bench, llama-server and
# llama-quantize into DIR.
build() {
  local dir=$1
  shift
  if [ -x "$dir/bin/llama-bench" ] && [ -x "$dir/bin/llama-server" ] && [ -x "$dir/bin/llama-quantize" ] &&
     [ -x "$dir/bin/llama-batched-bench" ]; then
    return
  fi
  cmake -S "$SRC" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >&2
  cmake --build "$dir" -j "$(nproc)" --target llama-bench llama-batched-bench llama-server llama-quantize >&2
}

build "$ROOT/build" -DGGML_NATIVE=ON
# Some virtual machines list AMX in /proc/cpuinfo, and llama.cpp built -march=native then
# dies with SIGILL in its AMX kernels (tilezero). Where a short llama-bench run on the
# default model dies so, llama.cpp is built again for the machine's other features
# (AVX-512 with VBMI, VNNI and BF16, AVX-VNNI), in a build directory of its own.
MODEL=$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$MODEL" ] && grep -qw amx_tile /proc/cpuinfo && \
   ! "$ROOT/build/bin/llama-bench" -m "$MODEL" -t 1 -r 1 -p 16 -n 0 >/dev/null 2>&1; then
  build "$ROOT/build-no-amx" -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
    -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
    -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON
  echo "$ROOT/build-no-amx/bin"
else
  echo "$ROOT/build/bin"
fi
