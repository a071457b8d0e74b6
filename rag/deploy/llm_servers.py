"""The llama-servers `rag up` starts: one per URL of the pool (RAG_LLM_URL's list, or its port and the next
RAG_LLM_SERVERS - 1), each on a GPU of its own when the profile runs on GPUs and the host has several."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from urllib.parse import urlparse

from rag.core.config import Settings


@dataclass(frozen=True)
class LLMServer:
    """One llama-server to start: its name among the parts, where it listens, what it may see."""

    name: str
    url: str
    host: str
    port: int
    env: dict[str, str]


def visible_gpus() -> list[str]:
    """The CUDA devices this host offers: CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`'s count."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(done.stdout.splitlines()) if line.startswith("GPU ")]


def llm_servers(settings: Settings, *, on_gpu: bool, gpus: list[str] | None = None) -> list[LLMServer]:
    """The servers of the pool. On GPUs, server i sees GPU i (round robin when there are more servers
    than GPUs, so that two servers can share one card); one server sees what the host shows it."""
    urls = settings.llm_urls
    cards = (visible_gpus() if gpus is None else gpus) if on_gpu and len(urls) > 1 else []
    servers = []
    for i, url in enumerate(urls):
        parsed = urlparse(url)
        name = "llama-server" if len(urls) == 1 else f"llama-server-{i + 1}"
        env = {"CUDA_VISIBLE_DEVICES": cards[i % len(cards)]} if cards else {}
        servers.append(LLMServer(name, url, parsed.hostname or "127.0.0.1", parsed.port or 80, env))
    return servers
