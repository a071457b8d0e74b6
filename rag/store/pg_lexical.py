"""The chunk record in PostgreSQL, shared by every replica, and each replica's own tantivy BM25 index
following it: `LexicalIndex`'s calls.

The record is the SQLite one's (`rag/store/chunk_record.py`): text, context, metadata (JSON) and the float16
vector per chunk, and per collection the embedder that made the vectors. The search index is the SQLite
default's tantivy index (`rag/store/_bm25.py`, the same tokenizer: CJK bigrams, stemmed English; the same
BM25 scores), kept in a folder of the replica's data dir and keyed by the record's row ids.

Every write of the record appends the row ids it deleted or inserted to `lexical_changes` (seq, chunk)
in the same transaction. Record writes take turns (the "record" advisory lock of
`rag/store/postgres.py`), so the log's seqs follow the commit order: a reader that has seen seq n has
seen every change before it. A replica applies the log past the last seq it applied (`applied.json`
beside its index, written after the index commit): each logged row id is deleted from the index and
indexed again from the record as it is now, so a change applied twice (a crash between the commit and
the file) changes nothing. It catches up on opening and before every search, count and idf (one
indexed `max(seq)` when nothing changed). An index that is missing, of another tokenizer or database
(the log's id in `meta`), or older than the log's pruned horizon (the log keeps its last
`KEEP_CHANGES` entries) is rebuilt from the record.

Replicas on one machine may share a data dir, hence the folder: tantivy's writer lock is exclusive across
processes, so one of them applies the log for all; a search that finds the writer held by another process
for more than a moment searches what that index has committed.

Version 1 of this part kept BM25 in PostgreSQL itself, one row per (term, chunk) in `lexical_terms`;
at 100k chunks a BM25 query there took over a second at p95 on 2 busy cores (bench/pgvector.py), where
the local index takes milliseconds. Version 2 drops that table for the change log.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import tantivy

from rag.core.errors import StoreLocked
from rag.store import record
from rag.store._bm25 import FORMAT, Bm25Index
from rag.store._tokenizer import Tokenizer, lexical_tokens
from rag.store.chunk_record import LexicalHit
from rag.store.postgres import Connection, PgStep, from_sqlite, migrate, run_script
from rag.store.record import EmbedderIdentity
from rag.store.sqlite import write_transaction

LOCAL_DIR = "lexical-pg.tantivy"  # a replica's index, in its data dir
KEEP_CHANGES = 500_000  # log entries kept: a replica further behind rebuilds (about as fast as applying them)
_APPLIED = "applied.json"
_BATCH = 5000
_OPEN_WAIT_S = 900.0  # opening waits for another process's rebuild of a shared folder
_SEARCH_WAIT_S = 2.0  # a search waits this long for another process applying the log, then searches as is
_PRUNE_EVERY_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id         BIGSERIAL PRIMARY KEY,
    collection TEXT NOT NULL,
    chunk_id   TEXT NOT NULL,
    doc_id     TEXT NOT NULL,
    text       TEXT NOT NULL,
    context    TEXT NOT NULL DEFAULT '',
    metadata   TEXT,
    vector     BYTEA,
    length     INTEGER NOT NULL,
    UNIQUE (collection, chunk_id)
);
CREATE INDEX IF NOT EXISTS chunks_by_doc ON chunks (collection, doc_id);
CREATE TABLE IF NOT EXISTS lexical_terms (
    term       TEXT NOT NULL,
    collection TEXT NOT NULL,
    chunk      BIGINT NOT NULL REFERENCES chunks (id) ON DELETE CASCADE,
    doc_id     TEXT NOT NULL,
    tf         INTEGER NOT NULL,
    length     INTEGER NOT NULL,
    PRIMARY KEY (term, collection, chunk)
);
CREATE INDEX IF NOT EXISTS lexical_terms_by_chunk ON lexical_terms (chunk);
CREATE TABLE IF NOT EXISTS lexical_stats (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    chunks BIGINT NOT NULL,
    length BIGINT NOT NULL
);
INSERT INTO lexical_stats VALUES (1, 0, 0) ON CONFLICT DO NOTHING
"""
# Version 2: BM25 moves to each replica's tantivy index; the record logs what changed for them to follow.
_CHANGE_LOG = """
CREATE TABLE IF NOT EXISTS lexical_changes (seq BIGSERIAL PRIMARY KEY, chunk BIGINT NOT NULL);
DROP TABLE IF EXISTS lexical_terms;
DROP TABLE IF EXISTS lexical_stats;
ALTER TABLE chunks DROP COLUMN IF EXISTS length;
INSERT INTO meta (key, value) VALUES ('lexical_log', gen_random_uuid()::text) ON CONFLICT (key) DO NOTHING;
INSERT INTO meta (key, value) VALUES ('lexical_horizon', '0') ON CONFLICT (key) DO NOTHING
"""
STEPS: list[PgStep] = [
    (
        "chunks with their context, metadata, vectors, embedders and BM25 terms",
        lambda db: run_script(db, _SCHEMA + ";" + from_sqlite(record.SCHEMA)),
    ),
    ("BM25 in each replica's tantivy index, following a change log", lambda db: run_script(db, _CHANGE_LOG)),
]


class PgLexicalIndex:
    """BM25 search over the chunks of every collection, and the record they are rebuilt from. `directory`
    is this replica's tantivy index (created or rebuilt as needed)."""

    def __init__(self, url: str, directory: Path, tokenizer: Tokenizer = lexical_tokens) -> None:
        self.tokenizer = tokenizer
        self._db = Connection(url, "record")
        self._reader = Connection(url, "record")  # searches do not wait behind a write's turn
        migrate(self._db, "record", STEPS)
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._follow_lock = threading.Lock()
        self._pruned_at = 0.0
        self._log_id = self._meta("lexical_log")
        self._format = f"{FORMAT}/{tokenizer.name}"
        directory.mkdir(parents=True, exist_ok=True)
        self._applied_file = directory / _APPLIED
        state = self._state()
        # Another tantivy schema cannot be opened: only then is the folder cleared (a tokenizer's change
        # rebuilds inside it, under the writer lock, as any rebuild does).
        self._bm25 = Bm25Index(directory, rebuild=bool(state) and state.get("format", "").split("/")[0] != FORMAT)
        self._known = -1  # the last seq this process saw applied
        self.catch_up(_OPEN_WAIT_S)

    def close(self) -> None:
        self._reader.close()
        self._db.close()

    def _write(self) -> Any:
        return write_transaction(self._db, self._lock)  # type: ignore[arg-type]  # Connection takes its calls

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock:
            return self._reader.execute(sql, tuple(params)).fetchall()

    def _meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    # Writes: the record and its change log, in one transaction.

    def add(self, collection: str, rows: Iterable[tuple[Any, ...]]) -> None:
        """Index (chunk_id, doc_id, text[, context[, metadata, vector]]) rows; re-adding a chunk id replaces it."""
        prepared = []
        for row in rows:
            chunk_id, doc_id, text, *rest = row
            rest += [None] * (3 - len(rest))
            prepared.append((chunk_id, doc_id, text, rest[0] or "", rest[1], rest[2]))
        if not prepared:
            return
        with self._write() as db:
            self._delete(db, "collection = ? AND chunk_id = ANY(?)", (collection, [p[0] for p in prepared]))
            db.execute(
                "WITH new AS (INSERT INTO chunks (collection, chunk_id, doc_id, text, context, metadata, vector) "
                "SELECT ?, * FROM unnest(?::text[], ?::text[], ?::text[], ?::text[], ?::text[], ?::bytea[]) "
                "RETURNING id) INSERT INTO lexical_changes (chunk) SELECT id FROM new ORDER BY id",
                (
                    collection,
                    [p[0] for p in prepared],
                    [p[1] for p in prepared],
                    [p[2] for p in prepared],
                    [p[3] for p in prepared],
                    [record.encode_metadata(p[4]) for p in prepared],
                    [None if p[5] is None else record.encode_vector(p[5]) for p in prepared],
                ),
            )
            self._prune(db)

    @staticmethod
    def _delete(db: Any, where: str, params: tuple[Any, ...]) -> int:
        """Delete chunks, logging their row ids; how many went."""
        ((n,),) = db.execute(
            f"WITH gone AS (DELETE FROM chunks WHERE {where} RETURNING id), "
            "logged AS (INSERT INTO lexical_changes (chunk) SELECT id FROM gone) SELECT count(*) FROM gone",
            params,
        ).fetchall()
        return int(n)

    def _prune(self, db: Any) -> None:
        """Drop the log past its last KEEP_CHANGES entries (now and then), moving the horizon with it."""
        if time.monotonic() - self._pruned_at < _PRUNE_EVERY_S:
            return
        self._pruned_at = time.monotonic()
        ((top,),) = db.execute("SELECT coalesce(max(seq), 0) FROM lexical_changes").fetchall()
        horizon = int(top) - KEEP_CHANGES
        ((have,),) = db.execute("SELECT value FROM meta WHERE key = 'lexical_horizon'").fetchall()
        if horizon > int(have):
            db.execute("DELETE FROM lexical_changes WHERE seq <= ?", (horizon,))
            db.execute("UPDATE meta SET value = ? WHERE key = 'lexical_horizon'", (str(horizon),))

    def delete_document(self, collection: str, doc_id: str) -> int:
        with self._write() as db:
            return self._delete(db, "collection = ? AND doc_id = ?", (collection, doc_id))

    def delete_collection(self, collection: str) -> int:
        """Its chunks and its embedder's record go: a collection made again under its name starts anew."""
        with self._write() as db:
            n = self._delete(db, "collection = ?", (collection,))
            db.execute("DELETE FROM embedders WHERE collection = ?", (collection,))
            return n

    def set_vectors(self, collection: str, vectors: Iterable[tuple[str, Any, dict[str, Any] | None]]) -> None:
        rows = [(record.encode_vector(v), record.encode_metadata(m), collection, cid) for cid, v, m in vectors]
        with self._write() as db:
            db.executemany(
                "UPDATE chunks SET vector = ?, metadata = coalesce(metadata, ?) WHERE collection = ? AND chunk_id = ?",
                rows,
            )

    def begin_reindex(self, collection: str) -> None:
        with self._write() as db:
            if db.execute("SELECT 1 FROM meta WHERE key = ?", (f"reindex:{collection}",)).fetchone() is None:
                db.execute("UPDATE chunks SET vector = NULL WHERE collection = ?", (collection,))
                db.execute("DELETE FROM embedders WHERE collection = ?", (collection,))
                db.execute("INSERT INTO meta (key, value) VALUES (?, '1')", (f"reindex:{collection}",))

    def reindexing(self, collection: str) -> bool:
        return bool(self._read("SELECT 1 FROM meta WHERE key = ?", (f"reindex:{collection}",)))

    def end_reindex(self, collection: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM meta WHERE key = ?", (f"reindex:{collection}",))

    def set_embedder(self, collection: str, identity: EmbedderIdentity) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO embedders (collection, model, dimensions, normalized, probe_text, probe, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (collection) DO UPDATE SET model = excluded.model, "
                "dimensions = excluded.dimensions, normalized = excluded.normalized, "
                "probe_text = excluded.probe_text, probe = excluded.probe, created_at = excluded.created_at",
                (
                    collection,
                    identity.model,
                    identity.dimensions,
                    int(identity.normalized),
                    identity.probe_text,
                    record.encode_vector(identity.probe),
                    time.time(),
                ),
            )

    # The record.

    def embedder(self, collection: str) -> EmbedderIdentity | None:
        with self._read_lock:
            return record.read_embedder(self._reader, collection)  # type: ignore[arg-type]  # the same calls

    def collections(self) -> list[str]:
        return [r[0] for r in self._read("SELECT DISTINCT collection FROM chunks ORDER BY collection")]

    def document_counts(self, collection: str) -> dict[str, tuple[int, int]]:
        rows = self._read(
            "SELECT doc_id, count(*), count(vector) FROM chunks WHERE collection = ? GROUP BY doc_id", (collection,)
        )
        return {doc_id: (int(n), int(v)) for doc_id, n, v in rows}

    def chunk_ids(self, collection: str) -> dict[str, str]:
        return dict(self._read("SELECT chunk_id, doc_id FROM chunks WHERE collection = ?", (collection,)))

    def records(
        self, collection: str, batch: int = 500
    ) -> Iterator[list[tuple[str, str, str, dict[str, Any], list[float] | None]]]:
        """The collection's chunks as (chunk_id, doc_id, text, metadata, vector or None), in batches."""
        after = 0
        while True:
            rows = self._read(
                "SELECT id, chunk_id, doc_id, text, metadata, vector FROM chunks WHERE collection = ? AND id > ? "
                "ORDER BY id LIMIT ?",
                (collection, after, batch),
            )
            if not rows:
                return
            after = rows[-1][0]
            yield [
                (cid, did, text, record.decode_metadata(meta), None if vec is None else record.decode_vector(vec))
                for _, cid, did, text, meta, vec in rows
            ]

    def search_count(self) -> int:
        """Chunks in this replica's search index (all collections); compare with the record's."""
        self.catch_up()
        return self._bm25.num_docs()

    def search_counts(self, collection: str, doc_ids: Iterable[str]) -> dict[str, int]:
        """Chunks per document in this replica's search index; compare with the record's `document_counts`."""
        self.catch_up()
        return self._bm25.document_counts(collection, doc_ids)

    def total(self) -> int:
        return int(self._read("SELECT count(*) FROM chunks")[0][0])

    # Reads.

    def chunks(self, collection: str, chunk_ids: Iterable[str]) -> dict[str, tuple[str, dict[str, Any]]]:
        ids = list(chunk_ids)[:1000]
        if not ids:
            return {}
        rows = self._read(
            "SELECT chunk_id, text, metadata FROM chunks WHERE collection = ? AND chunk_id = ANY(?)", (collection, ids)
        )
        return {cid: (text, record.decode_metadata(meta) or {}) for cid, text, meta in rows}

    def count_document(self, collection: str, doc_id: str) -> int:
        return int(
            self._read("SELECT count(*) FROM chunks WHERE collection = ? AND doc_id = ?", (collection, doc_id))[0][0]
        )

    def count(self, collection: str) -> int:
        return int(self._read("SELECT count(*) FROM chunks WHERE collection = ?", (collection,))[0][0])

    def search(self, collection: str, query: str, k: int, doc_ids: list[str] | None = None) -> list[LexicalHit]:
        """The k best chunks by BM25 for any of the query's terms, optionally within some documents."""
        terms = sorted(set(self.tokenizer(query)))
        if not terms or k <= 0:
            return []
        self.catch_up()
        hits = self._bm25.search(collection, terms, k, doc_ids)
        if not hits:
            return []
        found = {
            rowid: (chunk_id, doc_id)
            for rowid, chunk_id, doc_id in self._read(
                "SELECT id, chunk_id, doc_id FROM chunks WHERE id = ANY(?)", ([rowid for _, rowid in hits],)
            )
        }
        return [LexicalHit(*found[rowid], score) for score, rowid in hits if rowid in found]

    def document_chunks(self, collection: str, doc_id: str) -> list[tuple[str, dict[str, Any]]]:
        rows = self._read(
            "SELECT text, metadata FROM chunks WHERE collection = ? AND doc_id = ? ORDER BY id", (collection, doc_id)
        )
        return [(text, record.decode_metadata(meta)) for text, meta in rows]

    def held(self, collection: str, terms: Iterable[str], doc_ids: list[str] | None = None) -> set[str]:
        """The search terms that some chunk of the collection holds (as `LexicalIndex.held`)."""
        self.catch_up()
        return self._bm25.held(collection, terms, doc_ids)

    def idf(self, terms: Iterable[str], prior_docs: int = 1000) -> dict[str, float]:
        """BM25's idf of each term over the whole index, smoothed with `prior_docs` documents of none of
        them (as `LexicalIndex.idf`)."""
        self.catch_up()
        return self._bm25.idf(terms, prior_docs)

    # Following the record.

    def catch_up(self, wait_s: float = _SEARCH_WAIT_S) -> None:
        """Apply the record's changes this replica's index has not seen (rebuilding it when it must)."""
        with self._follow_lock:
            top = int(self._read("SELECT coalesce(max(seq), 0) FROM lexical_changes")[0][0])
            if top <= self._known:
                return
            applied = self._applied()
            if applied is not None and applied >= top:  # another process sharing the folder applied them
                self._bm25.reload()
                self._known = applied
                return
            try:
                writer = self._bm25.writer(wait_s)
            except StoreLocked:
                self._bm25.reload()  # another process is applying the same log: search what it committed
                return
            try:
                self._known = self._apply(writer)
            except BaseException:
                writer.rollback()
                raise
            finally:
                writer.wait_merging_threads()
            self._bm25.reload()

    def _apply(self, writer: tantivy.IndexWriter) -> int:
        """Under the writer: the log past the applied seq into the index, or a rebuild; the seq now applied."""
        applied = self._applied()  # read again: another process may have applied some meanwhile
        horizon = int(self._meta("lexical_horizon") or 0)
        if applied is None or applied < horizon:
            applied = self._rebuild(writer)
        while rows := self._read(
            "SELECT seq, chunk FROM lexical_changes WHERE seq > ? ORDER BY seq LIMIT ?", (applied, _BATCH)
        ):
            if int(self._meta("lexical_horizon") or 0) > applied:  # pruned past us while applying
                applied = self._rebuild(writer)
                continue
            rowids = sorted({int(chunk) for _, chunk in rows})
            self._bm25.delete_rows(writer, rowids)
            self._index_rows(writer, "id = ANY(?) ORDER BY id", (rowids,))
            applied = int(rows[-1][0])
        writer.commit()
        self._save_applied(applied)
        return applied

    def _rebuild(self, writer: tantivy.IndexWriter) -> int:
        """Index the whole record again; the seq it covers (changes after it are applied next)."""
        (top,) = self._read("SELECT coalesce(max(seq), 0) FROM lexical_changes")[0]  # before reading the chunks
        writer.delete_all_documents()
        after = 0
        while after := self._index_rows(writer, "id > ? ORDER BY id LIMIT ?", (after, _BATCH)):
            pass
        return int(top)

    def _index_rows(self, writer: tantivy.IndexWriter, where: str, params: tuple[Any, ...]) -> int:
        """Add the record's chunks matching `where` to the index; the last row id added (0: none)."""
        rows = self._read(f"SELECT id, collection, doc_id, text, context FROM chunks WHERE {where}", params)
        for rowid, collection, doc_id, text, context in rows:
            tokens = " ".join(self.tokenizer(f"{context}\n{text}" if context else text))
            self._bm25.add(writer, int(rowid), collection, doc_id, tokens)
        return int(rows[-1][0]) if rows else 0

    def _state(self) -> dict[str, Any]:
        try:
            state = json.loads(self._applied_file.read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _applied(self) -> int | None:
        """The last seq applied to the index; None when it must be rebuilt (missing, another tokenizer or log)."""
        state = self._state()
        if state.get("format") != self._format or state.get("log") != self._log_id or "seq" not in state:
            return None
        return int(state["seq"])

    def _save_applied(self, seq: int) -> None:
        tmp = self._applied_file.with_name(f"{_APPLIED}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"seq": seq, "format": self._format, "log": self._log_id}))
        os.replace(tmp, self._applied_file)
