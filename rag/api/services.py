"""The API process's long-lived parts, built once at start-up and closed at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import dataclass, field

from ingest.job_queue import JobQueue, run_queued
from ingest.jobs import JobRegistry
from ingest.pipeline import IngestPipeline
from rag.answering.answerer import Answerer
from rag.answering.retrieval import Retriever
from rag.clients.backends import EmbeddingBackend, LLMBackend
from rag.clients.embedding_pool import embedding_client
from rag.clients.llm_pool import llm_client
from rag.core.config import Settings
from rag.core.errors import BackendUnavailable, NotFound
from rag.store.backend import open_catalog, open_keys, open_lease, open_lexical, open_vectors
from rag.store.catalog import DocumentCatalog
from rag.store.chroma_vectors import REPAIR_HINT, ChunkStore, StoreLock
from rag.store.chunk_record import LexicalIndex
from rag.store.keys import KeyStore
from rag.store.probe import probe_chroma
from rag.store.vectors import VectorStore

log = logging.getLogger("rag.api")

DRAIN_TIMEOUT_S = 30.0


@dataclass
class Services:
    settings: Settings
    llm: LLMBackend
    embedder: EmbeddingBackend
    store: VectorStore
    lexical: LexicalIndex
    catalog: DocumentCatalog
    store_lock: StoreLock | None = None
    ingest: IngestPipeline | None = None  # built on first use when not given
    jobs: JobRegistry = field(default_factory=JobRegistry)
    answering: Answerer | None = None  # built on first use when not given
    keys: KeyStore | None = None  # opened on first use when not given
    queue: JobQueue | None = None  # upload jobs in the database (RAG_DATABASE_URL), this replica's worker
    worker: asyncio.Task[None] | None = None
    started: int = field(default_factory=lambda: int(time.time()))  # `created` of /v1/models

    def pipeline(self) -> IngestPipeline:
        """The ingestion pipeline over this process's store, embedder and catalog."""
        if self.ingest is None:
            lease = open_lease(self.settings)
            self.ingest = IngestPipeline(self.settings, self.embedder, self.store, self.lexical, self.catalog, lease)
        return self.ingest

    def key_store(self) -> KeyStore:
        """The scoped API keys (`rag keys`) of this data dir or database."""
        if self.keys is None:
            self.keys = open_keys(self.settings)
        return self.keys

    def answerer(self) -> Answerer:
        """The answering core over this process's retriever and llama-server."""
        if self.answering is None:
            retriever = Retriever(self.embedder, self.store, self.lexical, self.catalog, self.settings)
            self.answering = Answerer(self.llm, retriever, self.settings)
        return self.answering

    def start_worker(self) -> None:
        """With RAG_DATABASE_URL: this replica takes queued uploads (its own and other replicas')."""
        if self.settings.database_url and self.worker is None:
            pipeline = self.pipeline()
            self.queue = JobQueue(
                self.settings.database_url,
                pipeline.lease.token,
                self.settings.job_lease_s,
                stall_s=self.settings.job_stall_s,
                max_attempts=self.settings.job_max_attempts,
                lost=lambda: pipeline.lease.lost,
            )
            uploads = self.settings.data_dir / "uploads"
            keep = getattr(pipeline.lease, "keep", lambda: None)  # PgOwnerLease's
            self.worker = asyncio.create_task(run_queued(self.queue, pipeline, uploads, keep))

    async def aclose(self) -> None:
        if self.worker is not None:
            self.worker.cancel()  # its job is queued again for another replica (JobQueue.holding)
            with contextlib.suppress(asyncio.CancelledError):
                await self.worker
        await self.jobs.cancel_all(self.settings.shutdown_grace_s)  # 202 uploads get the grace requests get
        if self.ingest:
            # Uploads the server cancelled at shutdown are still rolling back: keep the stores open for them.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ingest.drained(), DRAIN_TIMEOUT_S)
        if self.answering:
            await self.answering.aclose()
        await self.llm.aclose()
        await self.embedder.aclose()
        self.lexical.close()
        self.catalog.close()
        self.store.close()
        if self.keys:
            self.keys.close()
        if self.queue:
            self.queue.close()
        if self.ingest:
            self.ingest.lease.release()
        if self.store_lock:
            self.store_lock.release()


def build_services(settings: Settings, *, owner: str = "the rag API") -> Services:
    """Open the clients and the store. The embedded store is locked to this process."""
    lock = None
    if settings.embedded_chroma:
        lock = StoreLock(settings.data_dir)
        lock.acquire(owner)
    try:
        store = open_store(settings)
        lexical = open_lexical(settings)
        catalog = open_catalog(settings)
    except BaseException:
        if lock:
            lock.release()
        raise
    services = Services(
        settings=settings,
        llm=llm_client(
            settings.llm_urls,
            model=settings.llm_model,
            timeout=settings.llm_timeout_s,
            probe_s=settings.pool_probe_s,
            probe_timeout_s=settings.probe_timeout_s,
        ),
        embedder=embedding_client(settings.embed_urls, model=settings.embed_model, stall_s=settings.probe_timeout_s),
        store=store,
        lexical=lexical,
        catalog=catalog,
        store_lock=lock,
    )
    remove_leftover_uploads(settings)
    # Documents that a stopped process left half indexed or half deleted go (they are not searchable
    # meanwhile: the catalog does not list them as indexed). A store that is away is retried next start.
    try:
        services.pipeline().recover()
    except BackendUnavailable as exc:
        log.warning("could not clean up interrupted ingestion yet: %s", exc.message)
    find_lost_vectors(services)
    return services


def open_store(settings: Settings) -> VectorStore:
    """The chunk store; an embedded Chroma is probed first in a child process: a damaged collection is
    reported and never opened here, since opening it can crash the process."""
    if not settings.embedded_chroma:
        return open_vectors(settings)
    probe = probe_chroma(settings.chroma_path)
    for name, reason in probe.damaged.items():
        log.error("Chroma's collection %r is damaged (%s); %s", name, reason, REPAIR_HINT)
    if probe.unreadable is not None:
        log.error(
            "the Chroma store at %s cannot be opened (%s); %s", settings.chroma_path, probe.unreadable, REPAIR_HINT
        )
        store = ChunkStore(None, settings.collection)
    else:
        store = ChunkStore.open(settings)
    store.damaged, store.unreadable = dict(probe.damaged), probe.unreadable
    return store


def find_lost_vectors(services: Services) -> None:
    """Note the collections where Chroma holds fewer vectors than the catalog's indexed chunks; remove
    the vectors of no indexed chunk where it holds more (a write cut short, by a full disk say)."""
    store, catalog = services.store, services.catalog
    for name, _ in catalog.collections():
        if name in store.damaged or store.unreadable:
            continue
        indexed = catalog.indexed_chunks(name)
        expected = sum(indexed.values())
        try:
            held = store.count(name)
            if held > expected and services.settings.embedded_chroma:  # no other writer
                held -= remove_orphans(services, name, indexed)
        except NotFound:
            held = 0
        except BackendUnavailable as exc:  # a store server that is away: checked at the next start
            log.warning("could not count the vectors of collection %r: %s", name, exc.message)
            continue
        if held < expected:
            where = "pgvector" if services.settings.vector_store == "pgvector" else "Chroma"
            store.out_of_step[name] = f"{where} holds {held:,} vectors for {expected:,} indexed chunks"
            log.error("collection %r is out of step: %s; %s", name, store.out_of_step[name], REPAIR_HINT)


def remove_orphans(services: Services, collection: str, indexed: dict[str, int]) -> int:
    """Delete the collection's vectors that belong to no indexed chunk of the record; how many went.
    Run at start, after `recover()`: no document of this store is being written."""
    recorded = services.lexical.chunk_ids(collection)
    orphans = sorted(cid for cid in services.store.ids(collection) if recorded.get(cid) not in indexed)
    if orphans:
        log.warning("removing %d vectors of no indexed chunk from collection %r", len(orphans), collection)
        services.store.delete_ids(collection, orphans)
    return len(orphans)


def remove_leftover_uploads(settings: Settings) -> None:
    """Delete the upload folders a stopped API left behind (this process holds the store: none is in use).

    With a Chroma server several APIs may share a data dir, so only the embedded store's owner cleans up.
    """
    if not settings.embedded_chroma:
        return
    for folder in sorted((settings.data_dir / "uploads").glob("upload-*")):
        log.warning("removing the upload folder %s left by a stopped process", folder.name)
        shutil.rmtree(folder, ignore_errors=True)
