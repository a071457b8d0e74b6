"""The API process's long-lived parts, built once at start-up and closed at shutdown."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ingest.jobs import JobRegistry
from ingest.pipeline import IngestPipeline
from rag.answering.answerer import Answerer
from rag.store.catalog import DocumentCatalog, OwnerLease
from rag.core.config import Settings
from rag.clients.embedding import EmbeddingClient
from rag.core.errors import BackendUnavailable
from rag.store.lexical import LexicalIndex
from rag.clients.llm import LlamaServerClient
from rag.answering.retrieval import Retriever
from rag.store.chunks import ChunkStore, StoreLock

log = logging.getLogger("rag.api")


@dataclass
class Services:
    settings: Settings
    llm: LlamaServerClient
    embedder: EmbeddingClient
    store: ChunkStore
    lexical: LexicalIndex
    catalog: DocumentCatalog
    store_lock: StoreLock | None = None
    ingest: IngestPipeline | None = None  # built on first use when not given
    jobs: JobRegistry = field(default_factory=JobRegistry)
    answering: Answerer | None = None  # built on first use when not given
    extras: dict[str, Any] = field(default_factory=dict)
    started: int = field(default_factory=lambda: int(time.time()))  # `created` of /v1/models

    def pipeline(self) -> IngestPipeline:
        """The ingestion pipeline over this process's store, embedder and catalog."""
        if self.ingest is None:
            lease = OwnerLease(self.settings.data_dir / "owners")
            self.ingest = IngestPipeline(self.settings, self.embedder, self.store, self.lexical, self.catalog, lease)
        return self.ingest

    def answerer(self) -> Answerer:
        """The answering core over this process's retriever and llama-server."""
        if self.answering is None:
            retriever = Retriever(self.embedder, self.store, self.lexical, self.catalog, self.settings)
            self.answering = Answerer(self.llm, retriever, self.settings)
        return self.answering

    async def aclose(self) -> None:
        if self.answering:
            await self.answering.aclose()
        await self.llm.aclose()
        await self.embedder.aclose()
        self.lexical.close()
        self.catalog.close()
        if self.ingest:
            self.ingest.lease.release()
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
        catalog = DocumentCatalog(settings.data_dir / "catalog.sqlite")
    except BaseException:
        if lock:
            lock.release()
        raise
    services = Services(
        settings=settings,
        llm=LlamaServerClient(settings.llm_url, model=settings.llm_model, timeout=settings.llm_timeout_s),
        embedder=EmbeddingClient(settings.embed_url, model=settings.embed_model),
        store=store,
        lexical=lexical,
        catalog=catalog,
        store_lock=lock,
    )
    # Documents that a stopped process left half indexed or half deleted go (they are not searchable
    # meanwhile: the catalog does not list them as indexed). A store that is away is retried next start.
    try:
        services.pipeline().recover()
    except BackendUnavailable as exc:
        log.warning("could not clean up interrupted ingestion yet: %s", exc.message)
    return services
