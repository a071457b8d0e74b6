"""The API process's long-lived parts, built once at start-up and closed at shutdown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rag.config import Settings
from rag.embedding_client import EmbeddingClient
from rag.lexical import LexicalIndex
from rag.llm_client import LlamaServerClient
from rag.store import ChunkStore, StoreLock


@dataclass
class Services:
    settings: Settings
    llm: LlamaServerClient
    embedder: EmbeddingClient
    store: ChunkStore
    lexical: LexicalIndex
    store_lock: StoreLock | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    async def aclose(self) -> None:
        await self.llm.aclose()
        await self.embedder.aclose()
        self.lexical.close()
        if self.store_lock:
            self.store_lock.release()


def build_services(settings: Settings, *, owner: str = "the rag API") -> Services:
    """Open the clients and the store. The embedded store is locked to this process."""
    lock = None
    if settings.chroma_mode == "embedded":
        lock = StoreLock(settings.data_dir)
        lock.acquire(owner)
    try:
        store = ChunkStore.open(settings)
        lexical = LexicalIndex(settings.data_dir / "lexical.sqlite")
    except BaseException:
        if lock:
            lock.release()
        raise
    return Services(
        settings=settings,
        llm=LlamaServerClient(settings.llm_url, model=settings.llm_model, timeout=settings.llm_timeout_s),
        embedder=EmbeddingClient(settings.embed_url, model=settings.embed_model),
        store=store,
        lexical=lexical,
        store_lock=lock,
    )
