"""`rag store check` and `rag store repair`: the derived indexes measured against the record, and rebuilt
from it.

The catalog says which documents are indexed and how many chunks each has; the record (the chunks
table of `lexical.sqlite`) holds those chunks' texts, metadata and vectors. Chroma and the BM25 index
are derived from them. A check counts, per collection, the catalog's chunks, the record's, Chroma's
(probed in a child process: a damaged collection can crash its engine) and the BM25 index's, and
compares Chroma's ids with the record's: a vector of no indexed chunk (a write cut short) is an orphan
that search would find, an indexed chunk without one is lost to dense search, even where the counts agree.

A repair rebuilds Chroma from the record into a new folder beside the old one and swaps them at the
end; the old one is kept as `chroma.damaged-<time>`. Chunks written before the record kept vectors get
theirs from the old Chroma where that collection still opens, else from the embedder. Every step is
written as it goes (vectors into the record, chunks into the new folder), so an interrupted repair
goes on where it stopped when run again. The BM25 index rebuilds itself from the record whenever it is
found out of step on opening (`LexicalIndex`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.core.config import Settings
from rag.core.errors import StoreUnavailable
from rag.store.backend import open_catalog, open_lexical, open_vectors
from rag.store.catalog import DocumentCatalog, DocumentCounts
from rag.store.chroma_vectors import HNSW, persistent_client
from rag.store.chunk_record import LexicalIndex
from rag.store.probe import ChromaProbe, chroma_ids, export_vectors, probe_chroma
from rag.store.vectors import VectorStore

REPAIR_COMMAND = "rag store repair"
BATCH = 500

Progress = Callable[[str, int, int], None]  # (stage, done, total)
Embed = Callable[[list[str]], list[list[float]]]


@dataclass
class CollectionCheck:
    name: str
    documents: int  # documents: indexed contents in the catalog (DocumentCatalog.counts)
    catalog_chunks: int
    record_chunks: int  # chunks of indexed documents in the record
    record_vectors: int  # of those, with a stored vector
    chroma: int | None  # vectors in Chroma; None when it cannot be read
    chroma_state: str  # ok, damaged, missing
    not_in_record: list[str] = field(default_factory=list)  # indexed documents whose chunks the record lacks
    failed: int = 0  # files that failed, kept in the catalog with their reason (not documents)
    # Chroma's ids against the record's indexed chunks; None when Chroma's ids could not be read.
    orphans: list[str] | None = None  # vectors of no indexed chunk
    missing: list[str] | None = None  # indexed chunks with no vector
    vectors: str = "Chroma"  # the store that holds the vectors (its name in the problems)

    @property
    def problems(self) -> list[str]:
        out = []
        where = self.vectors
        if self.chroma_state == "damaged":
            out.append(f"{where} cannot open this collection")
        elif self.orphans or self.missing:
            if self.orphans:
                out.append(
                    f"{where} holds {len(self.orphans):,} vectors of no indexed chunk (such as {self.orphans[0]!r})"
                )
            if self.missing:
                out.append(
                    f"{len(self.missing):,} indexed chunks have no vector in {where} (such as {self.missing[0]!r})"
                )
        elif self.chroma is not None and self.chroma != self.catalog_chunks:
            # More is as wrong as fewer: vectors of no indexed chunk (a write cut short) are found by search.
            out.append(f"{where} holds {self.chroma:,} vectors for {self.catalog_chunks:,} indexed chunks")
        elif self.chroma_state == "missing" and self.catalog_chunks:
            out.append(f"{where} has no such collection")
        if self.not_in_record:
            out.append(f"{len(self.not_in_record)} indexed documents are missing from the record: upload them again")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "collection": self.name,
            "documents": self.documents,
            "failed": self.failed,
            "catalog_chunks": self.catalog_chunks,
            "record_chunks": self.record_chunks,
            "record_vectors": self.record_vectors,
            "chroma": self.chroma,
            "chroma_state": self.chroma_state,
            "orphan_vectors": None if self.orphans is None else len(self.orphans),
            "missing_vectors": None if self.missing is None else len(self.missing),
            "problems": self.problems,
        }


@dataclass
class StoreCheck:
    collections: list[CollectionCheck]
    lexical_record: int  # chunks in the record, all collections
    lexical_index: int  # chunks in the BM25 index
    probe: ChromaProbe
    vectors: str = "Chroma"

    @property
    def consistent(self) -> bool:
        return self.probe.unreadable is None and not any(c.problems for c in self.collections)

    def to_dict(self) -> dict[str, Any]:
        return {
            "consistent": self.consistent,
            "vector_store": self.vectors,
            "chroma_unreadable": self.probe.unreadable,
            "lexical": {"record": self.lexical_record, "index": self.lexical_index},
            "collections": [c.to_dict() for c in self.collections],
            "fix": None if self.consistent else REPAIR_COMMAND,
        }


def check_store(
    data_dir: Path,
    chroma_path: Path,
    probe: ChromaProbe | None = None,
    chroma_held: dict[str, set[str]] | None = None,
) -> StoreCheck:
    """Count every collection in the catalog, the record, Chroma and the BM25 index (Chroma read in
    child processes unless the caller, who has it open, gives its counts and ids)."""
    probe = probe or probe_chroma(chroma_path)
    catalog = DocumentCatalog(data_dir / "catalog.sqlite")
    lexical = LexicalIndex(data_dir / "lexical.sqlite")
    try:
        if chroma_held is None:
            chroma_held = chroma_ids(chroma_path, sorted(probe.counts), data_dir / ".check-ids.jsonl")
        return _check(catalog, lexical, probe, chroma_held)
    finally:
        lexical.close()
        catalog.close()


def check_open_store(
    store: VectorStore, catalog: DocumentCatalog, lexical: LexicalIndex, vectors: str = "Chroma"
) -> StoreCheck:
    """The same check through a store that is open already: a running API's own Chroma client (read-only;
    uploads running meanwhile may show as a passing difference), a Chroma server, or pgvector."""
    healthy = [n for n in store.names() if n not in store.damaged] if store.unreadable is None else []
    probe = ChromaProbe({n: store.count(n) for n in healthy}, dict(store.damaged), store.unreadable)
    return _check(catalog, lexical, probe, {n: store.ids(n) for n in healthy}, vectors)


def check_database(settings: Settings) -> StoreCheck:
    """The check of a store whose catalog and record are in PostgreSQL (RAG_DATABASE_URL), its vectors in
    pgvector or a Chroma server: every process reads them at once, so it runs beside the APIs."""
    catalog, lexical, store = open_catalog(settings), open_lexical(settings), open_vectors(settings)
    try:
        return check_open_store(store, catalog, lexical, vectors_name(settings))
    finally:
        store.close()
        lexical.close()
        catalog.close()


def vectors_name(settings: Settings) -> str:
    return "pgvector" if settings.vector_store == "pgvector" else "Chroma"


def _check(
    catalog: DocumentCatalog,
    lexical: LexicalIndex,
    probe: ChromaProbe,
    held_ids: dict[str, set[str]] | None,
    vectors: str = "Chroma",
) -> StoreCheck:
    names = sorted(
        {n for n, _ in catalog.collections()} | set(lexical.collections()) | set(probe.counts) | set(probe.damaged)
    )
    held = held_ids or {}
    checks = [_check_collection(name, catalog, lexical, probe, held.get(name), vectors) for name in names]
    return StoreCheck(checks, lexical.total(), lexical.search_count(), probe, vectors)


def _check_collection(
    name: str,
    catalog: DocumentCatalog,
    lexical: LexicalIndex,
    probe: ChromaProbe,
    held: set[str] | None,
    vectors: str = "Chroma",
) -> CollectionCheck:
    indexed = catalog.indexed_chunks(name)
    in_record = lexical.document_counts(name)
    record = [in_record.get(d, (0, 0)) for d in indexed]
    state = "damaged" if name in probe.damaged else "ok" if name in probe.counts else "missing"
    if probe.unreadable is not None:
        state = "damaged"
    counts = catalog.counts().get(name, DocumentCounts())
    not_in_record = [d for d, n in indexed.items() if in_record.get(d, (0, 0))[0] < n]
    orphans, missing = _compare_ids(held, lexical.chunk_ids(name), indexed, set(not_in_record))
    return CollectionCheck(
        name=name,
        documents=counts.documents,
        failed=counts.failed,
        catalog_chunks=sum(indexed.values()),
        record_chunks=sum(n for n, _ in record),
        record_vectors=sum(v for _, v in record),
        chroma=probe.counts.get(name),
        chroma_state=state,
        not_in_record=not_in_record,
        orphans=orphans,
        missing=missing,
        vectors=vectors,
    )


def _compare_ids(
    held: set[str] | None, recorded: dict[str, str], indexed: dict[str, int], unrecorded: set[str]
) -> tuple[list[str] | None, list[str] | None]:
    """(orphans, missing): Chroma's ids of no indexed chunk of the record, the record's indexed chunks
    Chroma lacks. The vectors of an indexed document the record lacks are not orphans: that document
    is reported apart."""
    if held is None:
        return None, None
    expected = {cid for cid, doc_id in recorded.items() if doc_id in indexed}
    orphans = sorted(cid for cid in held - expected if cid.rsplit(":", 1)[0] not in unrecorded)
    return orphans, sorted(expected - held)


# Repair.


def repair_store(
    data_dir: Path, chroma_path: Path, *, embed: Embed | None = None, progress: Progress = lambda *a: None
) -> dict[str, int]:
    """Rebuild Chroma from the record: every indexed document's chunks, nothing else. Returns the
    vectors written per collection. The caller holds the store's lock (no API is running on it)."""
    probe = probe_chroma(chroma_path) if chroma_path.exists() else ChromaProbe()
    catalog = DocumentCatalog(data_dir / "catalog.sqlite")
    lexical = LexicalIndex(data_dir / "lexical.sqlite")
    try:
        names = sorted({n for n, _ in catalog.collections()} | set(lexical.collections()))
        for name in names:
            _fill_vectors(name, catalog, lexical, chroma_path, probe, embed, progress)
        rebuilt = chroma_path.with_name(chroma_path.name + ".rebuild")
        written = {name: _rebuild(name, catalog, lexical, rebuilt, progress) for name in names}
    finally:
        lexical.close()
        catalog.close()
    _swap(chroma_path, rebuilt)
    return written


def _fill_vectors(
    name: str,
    catalog: DocumentCatalog,
    lexical: LexicalIndex,
    chroma_path: Path,
    probe: ChromaProbe,
    embed: Embed | None,
    progress: Progress,
) -> None:
    """Give every indexed chunk of the record a vector: from the old Chroma if it opens, else embedded."""
    missing = _without_vectors(name, catalog, lexical)
    if not missing:
        return
    if name in probe.counts and probe.counts[name] and not lexical.reindexing(name):  # not the old model's
        salvaged = export_vectors(chroma_path, name, chroma_path.with_name(f".{name}.vectors.npz")) or {}
        found = [(cid, *salvaged[cid]) for cid, _, _ in missing if cid in salvaged]
        lexical.set_vectors(name, found)
        progress(f"{name}: vectors from Chroma", len(found), len(found))
        missing = [m for m in missing if m[0] not in salvaged]
    _embed_missing(name, missing, catalog, lexical, embed, progress, "Chroma")


def _without_vectors(name: str, catalog: DocumentCatalog, lexical: LexicalIndex) -> list[tuple[str, str, str]]:
    """(chunk id, doc id, text) of the record's indexed chunks that have no vector."""
    indexed = set(catalog.indexed_chunks(name))
    return [
        (cid, did, text)
        for batch in lexical.records(name)
        for cid, did, text, _, vec in batch
        if vec is None and did in indexed
    ]


def _embed_missing(
    name: str,
    missing: list[tuple[str, str, str]],
    catalog: DocumentCatalog,
    lexical: LexicalIndex,
    embed: Embed | None,
    progress: Progress,
    vectors_from: str,
) -> None:
    """Embed the (chunk id, doc id, text) chunks that neither the record nor the vector store had a vector of."""
    if missing and embed is None:
        raise StoreUnavailable(
            f"{len(missing):,} chunks of {name!r} have no stored vector and {vectors_from} cannot give them: "
            "start the embedding server (rag serve-embeddings) and run the repair again"
        )
    names = {d: catalog.get(name, d) for d in {did for _, did, _ in missing}}
    for start in range(0, len(missing), BATCH):
        part = missing[start : start + BATCH]
        assert embed is not None
        vectors = embed([text for _, _, text in part])
        lexical.set_vectors(
            name, [(cid, v, _fallback_metadata(cid, did, names[did])) for (cid, did, _), v in zip(part, vectors)]
        )
        progress(f"{name}: embedding", start + len(part), len(missing))


def reindex_collection(
    data_dir: Path,
    chroma_path: Path,
    collection: str,
    *,
    model: str,
    embed: Embed,
    progress: Progress = lambda *a: None,
) -> dict[str, int]:
    """Re-embed a collection from the record's texts with the current embedder, then rebuild Chroma.

    Resumable: the old vectors are dropped once, at the start; a second run embeds only what is left.
    """
    lexical = LexicalIndex(data_dir / "lexical.sqlite")
    try:
        _reembed(lexical, collection, model, embed, progress)
    finally:
        lexical.close()
    written = repair_store(data_dir, chroma_path, embed=embed, progress=progress)
    lexical = LexicalIndex(data_dir / "lexical.sqlite")
    try:
        lexical.end_reindex(collection)
    finally:
        lexical.close()
    return written


def _reembed(lexical: LexicalIndex, collection: str, model: str, embed: Embed, progress: Progress) -> None:
    """Give the record's chunks of `collection` vectors of `model`; the old ones are dropped once, at the start."""
    from rag.store.record import EmbedderIdentity

    lexical.begin_reindex(collection)
    missing = [(cid, text) for batch in lexical.records(collection) for cid, _, text, _, vec in batch if vec is None]
    total = sum(n for n, _ in lexical.document_counts(collection).values())
    done = total - len(missing)
    for start in range(0, len(missing), BATCH):
        part = missing[start : start + BATCH]
        vectors = embed([text for _, text in part])
        lexical.set_vectors(collection, [(cid, v, None) for (cid, _), v in zip(part, vectors)])
        if lexical.embedder(collection) is None:
            lexical.set_embedder(collection, EmbedderIdentity.of(model, part[0][1], vectors[0]))
        progress(f"{collection}: embedding", done + start + len(part), total)


def _fallback_metadata(chunk_id: str, doc_id: str, row: Any) -> dict[str, Any]:
    """What can be known of a chunk whose metadata only the lost index held: its document, file and place."""
    meta: dict[str, Any] = {"doc_id": doc_id}
    if row is not None:
        meta["source"] = row.name
    index = chunk_id.rsplit(":", 1)[-1]
    if index.isdigit():
        meta["chunk_index"] = int(index)
    return meta


def _rebuild(name: str, catalog: DocumentCatalog, lexical: LexicalIndex, target: Path, progress: Progress) -> int:
    """Write the indexed chunks of one collection into the Chroma store at `target`, skipping those there."""
    coll = _client(target).get_or_create_collection(name, configuration={"hnsw": HNSW}, embedding_function=None)
    indexed = catalog.indexed_chunks(name)
    total, done = sum(indexed.values()), 0
    progress(f"{name}: Chroma", 0, total)
    for batch in lexical.records(name, BATCH):
        rows = [r for r in batch if r[1] in indexed and r[4] is not None]
        present = set(coll.get(ids=[r[0] for r in rows], include=[])["ids"]) if rows else set()
        todo = [r for r in rows if r[0] not in present]
        if todo:
            coll.upsert(
                ids=[r[0] for r in todo],
                documents=[r[2] for r in todo],
                metadatas=[r[3] or {"doc_id": r[1]} for r in todo],
                embeddings=[r[4] for r in todo],
            )
        done += len(rows)
        progress(f"{name}: Chroma", done, total)
    return int(coll.count())


def _client(path: Path) -> Any:
    path.mkdir(parents=True, exist_ok=True)
    return persistent_client(path)


def _swap(chroma_path: Path, rebuilt: Path) -> None:
    """Put the rebuilt store in place; the old one stays beside it for inspection."""
    from chromadb.api.shared_system_client import SharedSystemClient

    SharedSystemClient.clear_system_cache()  # let go of the rebuilt store's files before it moves
    if chroma_path.exists():
        chroma_path.rename(chroma_path.with_name(f"{chroma_path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"))
    rebuilt.rename(chroma_path)


# The store in PostgreSQL (RAG_DATABASE_URL), its vectors in pgvector or a Chroma server: repaired in
# place, since another process serves that store (nothing to swap a folder under) and a second copy of
# every vector would double the database. Each collection's vectors are made the record's: an indexed
# chunk without a vector, or with another one (a model's old vectors), is written from the record, a
# vector of no indexed chunk is deleted, a collection of no record goes. Resumable: a second run writes
# only what is still wrong.


def repair_database(
    settings: Settings, *, embed: Embed | None = None, progress: Progress = lambda *a: None
) -> dict[str, int]:
    """Make the vectors of a PostgreSQL store the record's; the vectors held per collection after it.
    Refused while an API or `ingest` works on the store (their owner leases are live)."""
    from rag.store.postgres import live_owners

    assert settings.database_url is not None
    running = live_owners(settings.database_url)
    if running:
        raise StoreUnavailable(
            f"{running} process(es) (an API replica or `ingest`) work on this database: stop them, then run "
            f"`{REPAIR_COMMAND}` (`rag store check` runs beside them)"
        )
    catalog, lexical, store = open_catalog(settings), open_lexical(settings), open_vectors(settings)
    try:
        names = sorted({n for n, _ in catalog.collections()} | set(lexical.collections()))
        for name in names:
            _fill_from(store, name, catalog, lexical, embed, progress)
        written = {name: _make_like_record(store, name, catalog, lexical, progress) for name in names}
        for gone in sorted(set(store.names()) - set(names)):
            store.delete_collection(gone)
        return written
    finally:
        store.close()
        lexical.close()
        catalog.close()


def reindex_database(
    settings: Settings, collection: str, *, model: str, embed: Embed, progress: Progress = lambda *a: None
) -> dict[str, int]:
    """`reindex_collection` for a store in PostgreSQL: re-embed the record's texts, then repair in place."""
    lexical = open_lexical(settings)
    try:
        _reembed(lexical, collection, model, embed, progress)
    finally:
        lexical.close()
    written = repair_database(settings, embed=embed, progress=progress)
    lexical = open_lexical(settings)
    try:
        lexical.end_reindex(collection)
    finally:
        lexical.close()
    return written


def _fill_from(
    store: VectorStore,
    name: str,
    catalog: DocumentCatalog,
    lexical: LexicalIndex,
    embed: Embed | None,
    progress: Progress,
) -> None:
    """Give every indexed chunk of the record a vector: the store's own where it holds one, else embedded."""
    missing = _without_vectors(name, catalog, lexical)
    if missing and store.exists(name) and not lexical.reindexing(name):  # not the old model's
        salvaged = {
            cid: vector
            for start in range(0, len(missing), BATCH)
            for cid, vector in store.vectors_of(name, [m[0] for m in missing[start : start + BATCH]]).items()
        }
        lexical.set_vectors(name, [(cid, salvaged[cid], None) for cid, _, _ in missing if cid in salvaged])
        progress(f"{name}: vectors from the store", len(salvaged), len(salvaged))
        missing = [m for m in missing if m[0] not in salvaged]
    _embed_missing(name, missing, catalog, lexical, embed, progress, "the vector store")


def _make_like_record(
    store: VectorStore, name: str, catalog: DocumentCatalog, lexical: LexicalIndex, progress: Progress
) -> int:
    """Write the record's indexed chunks that the store lacks or holds another vector of; delete the rest."""
    import numpy as np

    identity = lexical.embedder(name)
    if identity is not None and store.exists(name) and store.dimensions(name) not in (None, identity.dimensions):
        store.delete_collection(name)  # vectors of another model's width: a table of the new width
    indexed = catalog.indexed_chunks(name)
    total, done, expected = sum(indexed.values()), 0, set[str]()
    progress(f"{name}: vectors", 0, total)
    with store.loading(name):  # pgvector: into an empty collection first, its index built after
        for batch in lexical.records(name, BATCH):
            rows = [r for r in batch if r[1] in indexed and r[4] is not None]
            expected.update(r[0] for r in rows)
            held = store.vectors_of(name, [r[0] for r in rows]) if rows and store.exists(name) else {}
            todo = [
                r
                for r in rows
                if r[0] not in held or not np.allclose(held[r[0]], np.asarray(r[4], np.float32), atol=1e-4)
            ]
            if todo:
                store.upsert(
                    name,
                    ids=[r[0] for r in todo],
                    embeddings=np.asarray([r[4] for r in todo], dtype=np.float32),
                    documents=[r[2] for r in todo],
                    metadatas=[r[3] or {"doc_id": r[1]} for r in todo],
                )
            done += len(rows)
            progress(f"{name}: vectors", done, total)
    orphans = sorted(store.ids(name) - expected) if store.exists(name) else []
    if orphans:
        store.delete_ids(name, orphans)
    return store.count(name) if store.exists(name) else 0
