"""The ingestion pipeline: load → chunk → embed → store. The `ingest` CLI and the upload endpoint both run it.

One run takes files in order. Up to three producers read, hash, load and chunk the next files at once
(each in a worker thread, so a PDF waiting on its parser does not hold up the files behind it) while
the consumer embeds batches of chunks (across document boundaries, `Settings.embed_batch` at a time,
chunks of similar length together, a few requests in flight) and writes them to Chroma and the lexical
index. A document turns searchable only when all its chunks are stored, in the catalog's
one-transaction switch, which also retires the previous version of its source; that version's chunks
are deleted after.

Crash safety comes from the order of writes: the catalog row (`pending`, with this process's owner
lease) is written before any chunk and removed only after every chunk is gone. A process that dies
leaves `pending`/`deleting` rows whose lease is free; `recover()` deletes their chunks and rows, and
the next run indexes those files again from scratch.

The parts live in private modules named for what they hold: `_records` (files, chunk records, results),
`_run` (one run: producers and consumer), `_locks` and `_pool` (its locks and embedding batches),
`_stores` (the order of writes), `_preparer` (loaders and chunker), `_lexical_context` (what BM25
indexes beside a chunk) and `_memory` (malloc tuning). The names callers use are re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ingest._locks import KeyedLocks
from ingest._memory import keep_big_buffers_out_of_the_heap
from ingest._preparer import LoaderPreparer, chunk_records, make_chunker
from ingest._records import (
    ChunkRecord,
    Embedder,
    FileResult,
    NoProgress,
    Prepared,
    Preparer,
    Progress,
    SourceFile,
    Status,
    document_id,
)
from ingest._run import RunConfig, run_files
from ingest._stores import DocumentStores
from ingest.originals import Originals
from rag.core.config import Settings
from rag.core.errors import BackendUnavailable
from rag.store.catalog import DocumentCatalog, DocumentRecord, OwnerLease
from rag.store.chroma_vectors import store_errors
from rag.store.chunk_record import LexicalIndex
from rag.store.record import check_embedder_of
from rag.store.vectors import VectorStore

__all__ = [
    "ChunkRecord",
    "Embedder",
    "FileResult",
    "IngestPipeline",
    "LoaderPreparer",
    "NoProgress",
    "Prepared",
    "Preparer",
    "Progress",
    "SourceFile",
    "Status",
    "chunk_records",
    "document_id",
    "make_chunker",
]

log = logging.getLogger("ingest")


class IngestPipeline:
    """Indexes files into one store; one instance per process, shared by concurrent runs."""

    def __init__(
        self,
        settings: Settings,
        embedder: Embedder,
        store: VectorStore,
        lexical: LexicalIndex,
        catalog: DocumentCatalog,
        lease: OwnerLease,
        *,
        prepare: Preparer | None = None,
        inflight: int = 3,
        producers: int = 3,
        flush_s: float = 0.05,
        window_batches: int = 8,
    ) -> None:
        self.settings = settings
        self.embedder = embedder
        self.store = store
        self.lexical = lexical
        self.catalog = catalog
        self.lease = lease
        self.stores = DocumentStores(store, lexical, catalog, settings.embed_model, Originals(settings.data_dir))
        self._prepare = prepare or LoaderPreparer(settings)
        # Per embedding server: a pool of them takes that many batches at once (least outstanding first).
        self._inflight = inflight * getattr(embedder, "servers", 1)
        self._producers = producers
        self._flush_s = flush_s
        self._window_batches = window_batches
        self.locks = KeyedLocks()
        self.deleted: set[tuple[str, str]] = set()  # documents whose DELETE waits for a run to let go
        self._verified: set[str] = set()  # collections whose recorded embedder this process checked
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        keep_big_buffers_out_of_the_heap()

    async def warm(self) -> None:
        """Make ready ahead of the first file what the preparer builds on first use (its chunker)."""
        warm = getattr(self._prepare, "warm", None)
        if warm is not None:
            await asyncio.to_thread(warm)

    async def drained(self) -> None:
        """Return once no run is in flight, clean-ups included. At shutdown the server cancels a request
        and moves on: the stores must stay open until its run has taken its half-done documents out."""
        await self._idle.wait()

    # A run.

    async def run(
        self, files: Sequence[SourceFile], collection: str, progress: Progress | None = None
    ) -> list[FileResult]:
        """Index `files` into `collection`; one result per file, in order.

        A file that cannot be indexed gets a `failed` result and the run goes on; a backend that fails
        (embedder, store) ends the run with its error, after taking this run's half-done documents out.
        """
        self._running += 1
        self._idle.clear()
        try:
            await self.check_embedder(collection)
            await self.retry_abandoned()
            return await run_files(self._run_config(), collection, files, progress or NoProgress())
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    def _run_config(self) -> RunConfig:
        return RunConfig(
            embedder=self.embedder,
            stores=self.stores,
            lease=self.lease,
            locks=self.locks,
            deleted=self.deleted,
            prepare=self._prepare,
            max_upload_bytes=self.settings.max_upload_bytes,
            embed_batch=self.settings.embed_batch,
            inflight=self._inflight,
            producers=self._producers,
            flush_s=self._flush_s,
            window_batches=self._window_batches,
        )

    async def check_embedder(self, collection: str) -> None:
        """Refuse to add vectors of another model to a collection: embed its probe text again and compare.

        Checked once per collection and process (one short request); the first write records the model.
        """
        if collection in self._verified:
            return

        async def embed(text: str) -> Sequence[float]:
            (vector,) = await self.embedder.embed([text])
            return list(vector)

        recorded = await asyncio.to_thread(self.lexical.embedder, collection)
        await check_embedder_of(collection, recorded, self.settings.embed_model, embed)
        self._verified.add(collection)

    # Deletion and recovery (also used by the API and --sync).

    async def delete(self, collection: str, doc_id: str, source: str | None = None) -> DocumentRecord | None:
        """Take a document out of search, then delete its chunks and its row; None if unknown.

        With `source`, only that name of the document goes; its content stays while another names it.
        A document being indexed stops at its next step (its result says `deleted`), then goes.
        """
        key = (collection, doc_id)
        stopping = source is None and key not in self.deleted
        if stopping:
            self.deleted.add(key)
        try:
            await self.locks.acquire(key)
        except BaseException:
            if stopping:
                self.deleted.discard(key)
            raise
        try:
            record = await asyncio.to_thread(self.catalog.get, collection, doc_id)
            if record is None or (
                source is not None and await asyncio.to_thread(self.catalog.drop_name, collection, doc_id, source)
            ):
                return record
            self.lease.check()  # a lost owner lease marks nothing for this process
            record = await asyncio.to_thread(
                self.catalog.mark_deleting,
                collection,
                doc_id,
                owner=self.lease.token,
                is_live=self.lease.held_elsewhere,
            )
            if record is not None:
                await asyncio.to_thread(self.stores.purge, collection, doc_id)
        finally:
            if stopping:  # before the lock goes: a run that takes it next indexes the file anew
                self.deleted.discard(key)
            self.locks.release(key)
        return record

    async def delete_collection(self, collection: str) -> bool:
        """Delete every document of a collection (those being indexed stop, as `delete` does), then the
        collection itself from Chroma and the record; False when there is no such collection."""
        rows = await asyncio.to_thread(self.catalog.list, collection, 0, 1 << 62)
        if not rows and not await asyncio.to_thread(self.store.exists, collection):
            return False
        for doc_id in dict.fromkeys(r.doc_id for r in rows):
            await self.delete(collection, doc_id)

        def drop() -> None:
            with store_errors():
                self.store.delete_collection(collection)
            self.lexical.delete_collection(collection)

        await asyncio.to_thread(drop)
        self._verified.discard(collection)
        return True

    async def retry_abandoned(self) -> None:
        """Take out the documents an earlier run of this process could not clean up (its store failed,
        a full disk say): pending or deleting rows of this process that no run or deletion holds."""
        mine = await asyncio.to_thread(self.catalog.leftovers, lambda owner: owner != self.lease.token)
        for record in mine:
            key = (record.collection, record.doc_id)
            if self.locks.held(key):
                continue
            await self.locks.acquire(key)
            try:
                log.warning(
                    "removing %s document %s (%s) left by a failed run", record.state, record.doc_id, record.name
                )
                await asyncio.to_thread(self.stores.purge, record.collection, record.doc_id)
            except BackendUnavailable as exc:  # still failing: the next run tries again, this one goes on
                log.warning("could not remove %s yet: %s", record.doc_id, exc.message)
            finally:
                self.locks.release(key)

    def recover(self) -> list[DocumentRecord]:
        """Clean up after processes that died mid-ingest: their pending and deleting documents go."""
        leftovers = self.catalog.leftovers(self.lease.is_live)
        for record in leftovers:
            log.warning(
                "removing %s document %s (%s) left by a stopped process", record.state, record.doc_id, record.name
            )
            self.stores.purge(record.collection, record.doc_id)
        for owner in {r.owner for r in leftovers if r.owner}:
            self.lease.forget(owner)
        return leftovers
