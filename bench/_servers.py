"""Servers a benchmark starts for itself, with the user's model settings.

A benchmark runs its servers in data dirs of its own, so the user's RAG_* settings are not passed on
wholesale (their data dir, ports and collection would leak in), but the model settings are: a run with
`RAG_EMBED_MODEL_PATH` or `RAG_LLM_MODEL_PATH` set measures that model, not the bundled one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MODEL_SETTINGS = (
    "RAG_CACHE_DIR",
    "RAG_MODELS_DIR",
    "RAG_LLM_MODEL",
    "RAG_LLM_MODEL_PATH",
    "RAG_LLM_PROFILE",
    "RAG_LLM_THREADS",
    "RAG_LLM_SERVER_BIN",
    "RAG_LLM_PROMPT_STYLE",
    "RAG_EMBED_MODEL",
    "RAG_EMBED_MODEL_PATH",
    "RAG_EMBED_DEVICE",
    "RAG_EMBED_THREADS",
)


def server_env(data_dir: Path, leave_out: Iterable[str] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a server in `data_dir`: of the RAG_* settings only the model ones."""
    skip = set(leave_out)
    env = {k: v for k, v in os.environ.items() if (not k.startswith("RAG_") or k in MODEL_SETTINGS) and k not in skip}
    env.update(RAG_DATA_DIR=str(data_dir), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def start_generator(workdir: Path) -> Any:
    """llama-server with the user's RAG_LLM_MODEL_PATH, profile and model name, or the bundled generator."""
    from rag.core.config import Settings
    from rag.deploy.modellock import ensure_bundled_generator
    from tests.servers import start_llama_server

    settings = Settings(data_dir=workdir)
    model = settings.llm_model_path or ensure_bundled_generator(settings)
    return start_llama_server(model, workdir, profile=settings.llm_profile, alias=settings.llm_model)
