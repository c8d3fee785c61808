#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-server and llama-quantize once, from the source
# inside PyPI's llama-cpp-python sdist (pinned), into the cache outside the repository:
#   $DSERVE_CACHE/llamacpp/<version>/build/bin/
# For side-by-side benchmarks only (make bench-compare); never part of make test.
# Built for this machine (GGML_NATIVE), as a user of llama.cpp would build it.
#   tools/llamacpp_build.sh   -> prints the bin directory
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${DSERVE_CACHE:-$HOME/.cache/dserve}
ROOT=$CACHE/llamacpp/$VERSION
PY=${PY:-.venv/bin/python}
BIN=$ROOT/build/bin

if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-quantize" ]; then
  echo "$BIN"
  exit 0
fi
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
cmake -S "$SRC" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >&2
cmake --build "$ROOT/build" -j "$(nproc)" --target llama-bench llama-server llama-quantize >&2
echo "$BIN"
