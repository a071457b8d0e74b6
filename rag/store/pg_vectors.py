"""The chunk store in PostgreSQL with pgvector (`RAG_VECTOR_STORE=pgvector`): `ChunkStore`'s calls, on
the database of RAG_DATABASE_URL that holds the catalog and the record.

One table per collection (`vectors_<n>`, named in `vector_collections`), not one table with a
collection column: a collection's vectors are `vector(dim)` of its own embedder's width (a typed column
is what an HNSW index needs, and collections of different embedders may sit side by side), each
collection's HNSW graph holds its own vectors only (pgvector filters after the index scan, so a shared
graph would answer a small collection's query from the first ef_search neighbours of every
collection, most of them filtered away), and deleting a collection is a DROP TABLE, not a delete of
rows and a graph left full of dead entries.

The rows are Chroma's: the chunk id, the text, the metadata (JSONB) and the vector, with the document id
in a column of its own, indexed, for the filters the API uses (a document's chunks, searches within
some documents). Scores are cosine similarities (1 - pgvector's `<=>` distance), ties in id order, as
the Chroma store gives them. HNSW with Chroma's parameters (m 16, ef_construction 200, ef_search 200).
A search within some documents is exact over their chunks: pgvector's HNSW scan would filter after the
graph's first ef_search neighbours and miss the documents' chunks that lie farther away.

Writes go through one connection, their vectors in binary (`_pgvector_wire`); a repair that fills an
empty collection writes its rows first and builds the index once after (`loading`), several times
faster than through the index. Reads take a connection of their own from a small pool (`pg_pool`), so
concurrent queries search at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from rag.core.errors import NotFound, StoreDamaged
from rag.store import _pgvector_wire as wire
from rag.store.chroma_vectors import HNSW, StoredChunk, dimension_mismatch, unknown_collection
from rag.store.pg_pool import ConnectionPool
from rag.store.postgres import Connection, PgStep, connect, migrate, require_pgvector, shown_url
from rag.store.record import Vectors
from rag.store.sqlite import write_transaction

log = logging.getLogger(__name__)

HNSW_M = 16  # Chroma's default M
BATCH = 1000  # rows per INSERT: one statement, its vectors one binary vector[] (`_pgvector_wire`)
READERS = 4  # reader connections per store: concurrent queries search at once, not one after another
# An index build's maintenance_work_mem: pgvector builds many times slower once its graph no longer fits
# in it, and a parallel build takes all of it as shared memory at once. Per row, the vector and 1 KiB
# for the element and its neighbour lists at m 16 (measured: 1,863 384-d rows filled 4 MiB, ~0.7 KiB
# each beyond the vector); never less than the server's own setting, and at most BUILD_MEMORY_MAX
# unless that is more.
BUILD_BYTES_PER_ROW = 1024
BUILD_MEMORY_MAX = 2 * 2**30

_COLLECTIONS = (
    "CREATE TABLE IF NOT EXISTS vector_collections (name TEXT PRIMARY KEY, id SERIAL UNIQUE NOT NULL, "
    "dimensions INTEGER NOT NULL, created_at DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM now()))"
)


def _first_version(db: Connection) -> None:
    require_pgvector(db)
    db.execute(_COLLECTIONS)


STEPS: list[PgStep] = [("pgvector and the table of vector collections", _first_version)]
EF_SEARCH = int(str(HNSW["ef_search"]))


def _table(number: int) -> str:
    return f"vectors_{int(number)}"


def _literal(vector: Sequence[float] | np.ndarray) -> str:
    """pgvector's text form of a vector; float32's shortest repr is exact."""
    return "[" + ",".join(map(str, np.asarray(vector, dtype=np.float32).tolist())) + "]"


class PgVectorStore:
    """Collections of chunk vectors with their text and metadata, in PostgreSQL tables with HNSW indexes."""

    def __init__(self, url: str, default_collection: str = "default", readers: int = READERS) -> None:
        self.url = url
        self.default_collection = default_collection
        # The Chroma store's state of a start-up probe; a database has none to find (no engine to crash).
        self.damaged: dict[str, str] = {}
        self.out_of_step: dict[str, str] = {}
        self.unreadable: str | None = None
        self.path = None
        self._db = Connection(url, "vectors", on_connect=_writer_settings)
        self.readers = readers
        # Reads do not wait on writes, nor on each other (up to `readers` at once).
        self._pool = ConnectionPool(url, "vectors", readers, on_connect=_search_settings)
        migrate(self._db, "vectors", STEPS)
        self._db.close()  # opened again at its next call: a connection older than the extension lacks its type
        self._lock = threading.Lock()
        self._loading: set[str] = set()  # collections written without their HNSW index (`loading`)

    @classmethod
    def open(cls, url: str, default_collection: str = "default") -> PgVectorStore:
        return cls(url, default_collection)

    def close(self) -> None:
        self._pool.close()
        self._db.close()

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._pool.connection() as reader:
            return reader.execute(sql, params).fetchall()

    # Collections.

    def _find(self, name: str) -> tuple[str, int] | None:
        """(table, dimensions) of a collection, or None."""
        row = self._read("SELECT id, dimensions FROM vector_collections WHERE name = ?", (name,))
        return (_table(row[0][0]), int(row[0][1])) if row else None

    def _table_of(self, name: str) -> tuple[str, int]:
        found = self._find(name)
        if found is None:
            raise self._unknown(name)
        return found

    def _readable(self, name: str) -> tuple[str, int] | None:
        """The collection's table for a read; None for the default collection before its first document."""
        found = self._find(name)
        if found is None and name != self.default_collection:
            raise self._unknown(name)
        return found

    def _create(self, name: str, dimensions: int) -> tuple[str, int]:
        """The collection's table, made at the width of its first vectors, with its HNSW index unless it is
        being loaded."""
        with write_transaction(self._db, self._lock) as db:  # type: ignore[arg-type]  # Connection takes the calls
            row = db.execute("SELECT id, dimensions FROM vector_collections WHERE name = ?", (name,)).fetchone()
            if row is not None:
                return _table(row[0]), int(row[1])
            (number,) = db.execute(
                "INSERT INTO vector_collections (name, dimensions) VALUES (?, ?) RETURNING id", (name, dimensions)
            ).fetchone() or (0,)
            table = _table(number)
            db.execute(
                f"CREATE TABLE {table} (id TEXT PRIMARY KEY, doc_id TEXT NOT NULL, document TEXT, "
                f"metadata JSONB, embedding vector({int(dimensions)}) NOT NULL)"
            )
            db.execute(f"CREATE INDEX {table}_by_doc ON {table} (doc_id)")
            if name not in self._loading:
                db.execute(_HNSW_INDEX.format(table=table))
        return table, dimensions

    @contextmanager
    def loading(self, collection: str) -> Iterator[None]:
        """Writes into an empty collection (a repair filling a new store) go in without its HNSW index,
        which is built once at the end: pgvector builds a graph from a full table many times faster than
        it inserts row by row through it. A collection that holds rows keeps its index and its writes
        go through it. A load cut short leaves a table without the index (searches are exact then); the
        next load into it builds it."""
        found = self._find(collection)
        if found is not None and self._indexed(found[0]) and not self._empty(found[0]):
            yield
            return
        self._loading.add(collection)
        try:
            if found is not None:
                self._db.execute(f"DROP INDEX IF EXISTS {found[0]}_hnsw")
            yield
        finally:
            self._loading.discard(collection)
            found = self._find(collection)
            if found is not None:
                self._build_index(found[0])

    def _indexed(self, table: str) -> bool:
        return bool(self._read("SELECT to_regclass(?) IS NOT NULL", (f"{table}_hnsw",))[0][0])

    def _empty(self, table: str) -> bool:
        return not self._read(f"SELECT 1 FROM {table} LIMIT 1")

    def _build_index(self, table: str) -> None:
        """The table's HNSW index, built in one pass with a maintenance_work_mem that holds its graph."""
        if self._indexed(table):
            return
        rows, dimensions, usual = self._read(
            f"SELECT count(*), max(vector_dims(embedding)), pg_size_bytes(current_setting('maintenance_work_mem')) "
            f"FROM {table}"
        )[0]
        memory = max(int(usual), min(int(rows) * (4 * int(dimensions or 0) + BUILD_BYTES_PER_ROW), BUILD_MEMORY_MAX))
        # A session of its own for the setting, whose notices are logged: pgvector says so when the graph
        # outgrew maintenance_work_mem (the build then goes on, many times slower).
        with connect(self.url) as conn:
            conn.add_notice_handler(_log_notice)
            conn.execute(f"SET maintenance_work_mem = '{-(-memory // 2**20)}MB'")  # rounded up
            conn.execute(_HNSW_INDEX.format(table=table))

    def _unknown(self, name: str) -> NotFound:
        return unknown_collection(name, self.names())

    def collection(self, name: str, *, create: bool = False) -> str:
        """The table of collection `name`; only writes create it (at their vectors' width)."""
        if self.unreadable is not None or name in self.damaged:
            raise StoreDamaged(f"the vectors of {name!r} are damaged ({self.unreadable or self.damaged[name]})")
        return self._table_of(name)[0]

    def names(self) -> list[str]:
        return [r[0] for r in self._read("SELECT name FROM vector_collections ORDER BY name")]

    def exists(self, name: str) -> bool:
        return self._find(name) is not None

    def dimensions(self, name: str) -> int | None:
        found = self._find(name)
        return None if found is None else found[1]

    def max_batch_size(self) -> int:
        return BATCH

    def heartbeat(self) -> bool:
        try:
            self._read("SELECT 1")
        except Exception:  # any failure of the server or the connection is "not alive"
            return False
        return True

    # Writes.

    def upsert(
        self,
        collection: str,
        ids: list[str],
        embeddings: Vectors | list[list[float]],
        documents: list[str],
        metadatas: list[dict[str, Any]],
    ) -> None:
        if not ids:
            return
        width = len(embeddings[0])
        table, dimensions = self._find(collection) or self._create(collection, width)
        for vector in embeddings:
            if len(vector) != dimensions:
                raise dimension_mismatch(collection, dimensions, len(vector))
        for start in range(0, len(ids), BATCH):
            end = start + BATCH
            self._db.execute(
                f"INSERT INTO {table} (id, doc_id, document, metadata, embedding) "
                "SELECT i, d, t, m::jsonb, e FROM unnest(?::text[], ?::text[], ?::text[], ?::text[], ?::vector[]) "
                "AS u (i, d, t, m, e) ON CONFLICT (id) DO UPDATE SET doc_id = excluded.doc_id, "
                "document = excluded.document, metadata = excluded.metadata, embedding = excluded.embedding",
                (
                    ids[start:end],
                    [str(m.get("doc_id") or i.rsplit(":", 1)[0]) for i, m in zip(ids[start:end], metadatas[start:end])],
                    documents[start:end],
                    [json.dumps(m) for m in metadatas[start:end]],
                    wire.VectorArray(embeddings[start:end]),
                ),
            )

    def delete_document(self, collection: str, doc_id: str) -> None:
        found = self._find(collection)
        if found is not None:
            self._db.execute(f"DELETE FROM {found[0]} WHERE doc_id = ?", (doc_id,))

    def delete_ids(self, collection: str, ids: list[str]) -> None:
        table = self.collection(collection)
        for start in range(0, len(ids), BATCH * 5):
            self._db.execute(f"DELETE FROM {table} WHERE id = ANY(?)", (ids[start : start + BATCH * 5],))

    def delete_collection(self, name: str) -> None:
        with write_transaction(self._db, self._lock) as db:  # type: ignore[arg-type]  # Connection takes the calls
            row = db.execute("DELETE FROM vector_collections WHERE name = ? RETURNING id", (name,)).fetchone()
            if row is not None:
                db.execute(f"DROP TABLE IF EXISTS {_table(row[0])}")

    # Reads.

    def count_document(self, collection: str, doc_id: str) -> int:
        found = self._find(collection)
        if found is None:
            return 0
        return int(self._read(f"SELECT count(*) FROM {found[0]} WHERE doc_id = ?", (doc_id,))[0][0])

    def ids(self, collection: str, step: int = 5000) -> set[str]:
        found = self._readable(collection)
        return set() if found is None else {r[0] for r in self._read(f"SELECT id FROM {found[0]}")}

    def count(self, collection: str) -> int:
        found = self._readable(collection)
        return 0 if found is None else int(self._read(f"SELECT count(*) FROM {found[0]}")[0][0])

    def get(self, collection: str, ids: list[str]) -> list[StoredChunk]:
        found = self._readable(collection) if ids else None
        if found is None:
            return []
        rows = self._read(f"SELECT id, document, metadata FROM {found[0]} WHERE id = ANY(?)", (ids,))
        by_id = {i: StoredChunk(i, doc or "", dict(meta or {})) for i, doc, meta in rows}
        return [by_id[i] for i in ids if i in by_id]

    def vectors_of(self, collection: str, ids: list[str]) -> dict[str, np.ndarray]:
        """The vectors the collection holds of some chunk ids (what a repair compares with the record)."""
        found = self._find(collection) if ids else None
        if found is None:
            return {}
        rows = self._read(f"SELECT id, embedding::real[] FROM {found[0]} WHERE id = ANY(?)", (ids,))
        return {i: np.asarray(v, dtype=np.float32) for i, v in rows}

    def query(
        self, collection: str, embedding: list[float], k: int, doc_ids: list[str] | None = None, *, texts: bool = True
    ) -> list[StoredChunk]:
        """The k nearest chunks (`texts=False`: ids and scores only, as `ChunkStore.query`)."""
        found = self._readable(collection)
        if found is None or k <= 0:
            return []
        table, dimensions = found
        if len(embedding) != dimensions:
            raise dimension_mismatch(collection, dimensions, len(embedding))
        columns = "id, document, metadata" if texts else "id, NULL, NULL"
        vector = _literal(embedding)
        if doc_ids:
            # Exact over the documents' chunks: MATERIALIZED keeps the planner off the HNSW index.
            sql = (
                f"WITH c AS MATERIALIZED (SELECT {columns}, embedding <=> ?::vector AS d FROM {table} "
                "WHERE doc_id = ANY(?)) SELECT * FROM c ORDER BY d, id LIMIT ?"
            )
            params: tuple[Any, ...] = (vector, list(doc_ids), k)
        else:
            sql = f"SELECT {columns}, embedding <=> ?::vector AS d FROM {table} ORDER BY d LIMIT ?"
            params = (vector, k)
        with self._pool.connection() as reader:
            rows = _search(reader, sql, params, k)
        hits = [
            StoredChunk(i, (doc or "") if texts else None, dict(meta or {}) if texts else {}, 1.0 - float(d))
            for i, doc, meta, d in rows
        ]
        return sorted(hits, key=lambda h: (-h.score, h.id))

    def describe(self) -> str:
        return f"pgvector at {shown_url(self.url)}"


_HNSW_INDEX = (
    "CREATE INDEX IF NOT EXISTS {table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops) "
    f"WITH (m = {HNSW_M}, ef_construction = {HNSW['ef_construction']})"
)


def _search(reader: Connection, sql: str, params: tuple[Any, ...], k: int) -> list[tuple[Any, ...]]:
    """The rows of a search, with an ef_search of at least k (pgvector's HNSW scan returns no more)."""
    usual = EF_SEARCH
    if k <= usual:
        return reader.execute(sql, params).fetchall()
    reader.execute("SELECT set_config('hnsw.ef_search', ?, false)", (str(k),))
    try:
        return reader.execute(sql, params).fetchall()
    finally:
        reader.execute("SELECT set_config('hnsw.ef_search', ?, false)", (str(usual),))


def _log_notice(notice: Any) -> None:
    log.warning("PostgreSQL: %s %s", notice.message_primary, notice.message_hint or "")


def _writer_settings(conn: Any) -> None:
    _search_settings(conn)
    wire.register(conn)


def _search_settings(conn: Any) -> None:
    conn.execute(f"SET hnsw.ef_search = {EF_SEARCH}")
