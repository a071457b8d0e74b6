"""One run of the pipeline: a few producers open files while the consumer embeds and stores their chunks.

The run reads nothing of its pipeline but the `RunConfig` it is given when it starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest._locks import KeyedLocks, Turns
from ingest._pool import FLUSH, Pool
from ingest._records import ChunkRecord, Embedder, FileResult, Prepared, Preparer, Progress, SourceFile, document_id
from ingest._stores import DocumentStores
from ingest.detect import check_zip_file
from ingest.sandbox import page_listener
from rag.core.errors import Conflict, DocumentRejected, FileTooLarge, RagError
from rag.store.catalog import Claim, DocumentRecord, OwnerLease

log = logging.getLogger("ingest")


@dataclass(frozen=True)
class RunConfig:
    """What a run takes from its pipeline, fixed when it starts: the parts it calls and its tuning."""

    embedder: Embedder
    stores: DocumentStores
    lease: OwnerLease
    locks: KeyedLocks  # shared by the pipeline's runs and deletions
    deleted: set[tuple[str, str]]  # (collection, doc_id) of documents whose DELETE waits for this run
    prepare: Preparer
    max_upload_bytes: int
    embed_batch: int  # chunks per embedding request
    inflight: int  # embedding requests in flight
    producers: int  # files opened at once
    flush_s: float  # how long the consumer waits for more chunks before a partial batch goes
    window_batches: int  # the pool holds this many batches; a chunk waits at most this many


@dataclass
class _Doc:
    """A document of this run, from its lock and claim to searchable (or failed)."""

    slot: int
    file: SourceFile
    doc_id: str
    prepared: Prepared | None = None
    stored: int = 0
    dropped: int = 0  # chunks not embedded or not written: the document was deleted meanwhile


async def run_files(
    config: RunConfig, collection: str, files: Sequence[SourceFile], progress: Progress
) -> list[FileResult]:
    """Index `files` into `collection`; one result per file, in order. A backend that fails ends the run
    with its error, after taking this run's half-done documents out."""
    run = _Run(config, collection, files, progress)
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


class _Run:
    """The state of one `IngestPipeline.run`: the producer, the consumer and the documents in between."""

    def __init__(self, config: RunConfig, collection: str, files: Sequence[SourceFile], progress: Progress):
        self.c = config
        self.collection = collection
        self.files = files
        self.progress = progress
        self.results: list[FileResult | None] = [None] * len(files)
        self.claimed: dict[str, _Doc] = {}
        # Bounded: the producer stays a few documents ahead of the consumer, which holds at most one
        # batch beside those in flight, whatever the corpus size.
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=4)
        self._limit = asyncio.Semaphore(config.inflight)
        self._turns = Turns()
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
        slots = asyncio.Semaphore(self.c.producers)

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
            data, doc_id = await asyncio.to_thread(_read_limited, file.path, self.c.max_upload_bytes)
        except (OSError, RagError) as exc:
            error = (
                exc
                if isinstance(exc, RagError)
                else DocumentRejected(f"cannot read {file.name}: {exc.strerror or exc}")
            )
            await self._turns.take(slot)
            await self._turns.pass_on(slot)
            self._finish(slot, FileResult(file.name, file.source, None, "failed", error.message, error=error))
            return None
        doc = _Doc(slot, file, doc_id)
        await self._turns.take(slot)
        try:
            await self.c.locks.acquire(self._key(doc))
        finally:
            await self._turns.pass_on(slot)
        # From here on `cleanup` knows the document; it undoes only what this process claimed.
        self.claimed[doc.doc_id] = doc
        claim, before = await self._io(self._claim, doc, len(data))
        if claim == "indexed":
            assert before is not None
            await self._unchanged(doc, before)
            return None
        if claim == "busy":
            busy = Conflict(f"{file.name} is being indexed by another process")
            self._release(doc, FileResult(file.name, file.source, doc.doc_id, "failed", busy.message, error=busy))
            return None
        if before is not None:  # a failed or abandoned attempt may have left chunks
            await self._io(self.c.stores.delete_chunks, self.collection, doc.doc_id)
        # The load runs in a thread with a copy of this task's context: each page OCR reads is reported.
        page_listener.set(lambda n, total: self.progress.page_read(file, n, total))
        try:
            doc.prepared = await asyncio.to_thread(self.c.prepare, data, file, doc.doc_id)
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
        if self._deleted(doc):
            self._release(doc, _deleted_result(doc))
            return None
        if doc.prepared.keep_original:
            await self._io(self.c.stores.save_original, self.collection, doc.doc_id, data)
        return doc

    def _claim(self, doc: _Doc, size: int) -> tuple[Claim, DocumentRecord | None]:
        """The catalog's claim of the document for this process, unless its owner lease is lost."""
        self.c.lease.check()
        return self.c.stores.catalog.claim(
            self.collection,
            doc.doc_id,
            source=doc.file.source,
            name=doc.file.name,
            size=size,
            owner=self.c.lease.token,
            is_live=self.c.lease.held_elsewhere,
        )

    def _key(self, doc: _Doc) -> tuple[str, str]:
        return (self.collection, doc.doc_id)

    def _deleted(self, doc: _Doc) -> bool:
        """Whether a DELETE of this document waits for its lock: its work stops, the DELETE removes the rest."""
        return self._key(doc) in self.c.deleted

    async def _unchanged(self, doc: _Doc, record: DocumentRecord) -> None:
        # The content is indexed already (perhaps under another name): other versions of this source go.
        retired = await self._io(
            self.c.stores.catalog.retire_source,
            self.collection,
            doc.file.source,
            keep=doc.doc_id,
            owner=self.c.lease.token,
        )
        for old in retired:
            await self._io(self.c.stores.purge, self.collection, old)
        # Known under another source: this one becomes another name of it, listed and kept on its own.
        await self._io(
            self.c.stores.catalog.add_name, self.collection, doc.doc_id, source=doc.file.source, name=doc.file.name
        )
        self._release(doc, FileResult(doc.file.name, doc.file.source, doc.doc_id, "unchanged", chunks=record.chunks))

    async def _fail(self, doc: _Doc, exc: RagError) -> None:
        await self._io(self.c.stores.catalog.mark_failed, self.collection, doc.doc_id, exc.message)
        self._release(doc, FileResult(doc.file.name, doc.file.source, doc.doc_id, "failed", exc.message, error=exc))

    def _release(self, doc: _Doc, result: FileResult) -> None:
        """The document is done with, either way: unlock it and report."""
        self.claimed.pop(doc.doc_id, None)
        self.c.locks.release(self._key(doc))
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
        pool: Pool[_Doc] = Pool()
        size, patience = self.c.embed_batch, self.c.window_batches
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), self.c.flush_s) if pool else await self.queue.get()
            except TimeoutError:
                item = FLUSH
            if isinstance(item, _Doc):
                assert item.prepared is not None
                pool.add(item, item.prepared.records)
                while len(pool) >= size * patience or (len(pool) >= size and not self._limit.locked()):
                    await self._launch(group, pool.take(size, patience))
            elif item is FLUSH:
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
        docs = {doc.doc_id: doc for doc, _ in batch}
        try:
            batch = self._without_deleted(batch)
            vectors: Any = await self.c.embedder.embed([r.text for _, r in batch]) if batch else []
        finally:
            self._limit.release()  # the next batch goes out while this one is written
        batch, vectors = self._without_deleted(batch, vectors)
        if batch:
            await self._io(self.c.stores.write_chunks, self.collection, [r for _, r in batch], vectors)
            self.progress.chunks_stored(len(batch))
        per_doc = Counter(doc.doc_id for doc, _ in batch)
        for doc in docs.values():
            doc.stored += per_doc[doc.doc_id]
            assert doc.prepared is not None
            if doc.stored + doc.dropped < len(doc.prepared.records):
                continue
            if doc.dropped or self._deleted(doc):
                # No write of it is in flight now: its DELETE may take the lock and remove what was written.
                self._release(doc, _deleted_result(doc))
            else:
                await self._searchable(doc)

    def _without_deleted(self, batch: list[tuple[_Doc, ChunkRecord]], vectors: Any = None) -> Any:
        """The batch less the chunks of deleted documents (counted as dropped); with `vectors`, theirs too."""
        keep = [i for i, (doc, _) in enumerate(batch) if not self._deleted(doc)]
        for i in set(range(len(batch))) - set(keep):
            batch[i][0].dropped += 1
        kept = [batch[i] for i in keep]
        return kept if vectors is None else (kept, [vectors[i] for i in keep])

    async def _searchable(self, doc: _Doc) -> None:
        assert doc.prepared is not None
        chunks, pages, warnings = len(doc.prepared.records), doc.prepared.pages, doc.prepared.warnings
        retired = await self._io(
            self.c.stores.catalog.mark_indexed,
            self.collection,
            doc.doc_id,
            chunks=chunks,
            pages=pages,
            owner=self.c.lease.token,
        )
        doc.prepared = None
        indexed = FileResult(doc.file.name, doc.file.source, doc.doc_id, "indexed", chunks=chunks, warnings=warnings)
        self._release(doc, _deleted_result(doc) if self._deleted(doc) else indexed)
        for old in retired:
            await self._io(self.c.stores.purge, self.collection, old)

    # Failure of the whole run.

    async def cleanup(self) -> None:
        """Take this run's unfinished documents out: wait for writes in flight, delete their chunks, mark
        them failed. A document whose chunks cannot be deleted stays pending for `recover`."""
        await asyncio.gather(*self._writes, return_exceptions=True)
        try:
            landed = await asyncio.to_thread(self._abandon, list(self.claimed.values()))
            for doc, chunks in landed:  # made searchable by a write that landed after the stop: it is done
                self._release(doc, FileResult(doc.file.name, doc.file.source, doc.doc_id, "indexed", chunks=chunks))
        except RagError as exc:  # the store away too: the rows stay pending under this owner, its next claim's
            log.warning("could not take the unfinished documents out: %s", exc.message)
        finally:  # unlocked whatever happened: a lock left held would stop this document's next run here
            for doc in list(self.claimed.values()):
                self.c.locks.release(self._key(doc))
            self.claimed.clear()

    def _abandon(self, docs: list[_Doc]) -> list[tuple[_Doc, int]]:
        """Take the unfinished documents out; those whose last write made them searchable meanwhile (the stop
        came while it ran in its thread) are returned with their chunks, to be reported done."""
        landed = []
        for doc in docs:
            record = self.c.stores.catalog.get(self.collection, doc.doc_id)
            if record is not None and record.state == "indexed":
                landed.append((doc, record.chunks))
                continue
            if record is None or record.state != "pending" or record.owner != self.c.lease.token:
                continue
            try:
                self.c.stores.delete_chunks(self.collection, doc.doc_id)
            except RagError:
                log.warning("could not delete the chunks of %s; the next start removes them", doc.doc_id)
                continue
            self.c.stores.catalog.mark_failed(
                self.collection, doc.doc_id, "interrupted: the run stopped before it was indexed"
            )
        return landed


def _deleted_result(doc: _Doc) -> FileResult:
    return FileResult(
        doc.file.name, doc.file.source, doc.doc_id, "deleted", "deleted while it was being indexed; nothing is kept"
    )


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
