"""The chunk record and its BM25 index in PostgreSQL: `LexicalIndex`'s calls, shared by every replica.

The record is the SQLite one's (`rag/store/lexical.py`): text, context, metadata (JSON) and the float16
vector per chunk, and per collection the embedder that made the vectors. The search index beside it is
an inverted index of our own tokenizer's terms (`rag/store/_tokenizer.py`: CJK bigrams, stemmed
English), one row per (term, chunk) with the term's frequency and the chunk's length, written in the
same transaction as the record: a replica never sees a chunk without its terms, and there is no
second store to follow or rebuild.

Scores are BM25 as tantivy computes them (k1 1.2, b 0.75, idf ln(1 + (N - n + 0.5) / (n + 0.5)), N
and the average length over the whole index), so the hybrid fusion's weights, tuned on tantivy's
scores, hold. PostgreSQL's own `ts_rank_cd` is not BM25 (no idf, no length normalisation of this
kind); a term table sums BM25 in one grouped index scan.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from rag.store import record
from rag.store._tokenizer import Tokenizer, lexical_tokens
from rag.store.lexical import LexicalHit
from rag.store.postgres import Connection, PgStep, from_sqlite, migrate, run_script
from rag.store.record import EmbedderIdentity
from rag.store.sqlite import write_transaction

K1, B = 1.2, 0.75

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
STEPS: list[PgStep] = [
    (
        "chunks with their context, metadata, vectors, embedders and BM25 terms",
        lambda db: run_script(db, _SCHEMA + ";" + from_sqlite(record.SCHEMA)),
    )
]

# The k best chunks of a collection for the query's (term, idf) pairs, BM25 summed over the terms.
_SEARCH = f"""
SELECT t.chunk, sum(q.idf * t.tf * {K1 + 1} / (t.tf + {K1} * (1 - {B} + {B} * t.length / ?::float8))) AS score
FROM lexical_terms t JOIN unnest(?::text[], ?::float8[]) AS q (term, idf) ON q.term = t.term
WHERE t.collection = ? {{only}}
GROUP BY t.chunk ORDER BY score DESC, t.chunk LIMIT ?
"""


class PgLexicalIndex:
    """BM25 search over the chunks of every collection, and the record they are rebuilt from."""

    def __init__(self, url: str, tokenizer: Tokenizer = lexical_tokens) -> None:
        self.tokenizer = tokenizer
        self._db = Connection(url, "record")
        self._reader = Connection(url, "record")  # searches do not wait behind a write's turn
        migrate(self._db, "record", STEPS)
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()

    def close(self) -> None:
        self._reader.close()
        self._db.close()

    def _write(self) -> Any:
        return write_transaction(self._db, self._lock)  # type: ignore[arg-type]  # Connection takes its calls

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock:
            return self._reader.execute(sql, tuple(params)).fetchall()

    # Writes.

    def add(self, collection: str, rows: Iterable[tuple[Any, ...]]) -> None:
        """Index (chunk_id, doc_id, text[, context[, metadata, vector]]) rows; re-adding a chunk id replaces it."""
        prepared = []
        for row in rows:
            chunk_id, doc_id, text, *rest = row
            rest += [None] * (3 - len(rest))
            context, metadata, vector = rest[0] or "", rest[1], rest[2]
            terms = Counter(self.tokenizer(f"{context}\n{text}" if context else text))
            prepared.append((chunk_id, doc_id, text, context, metadata, vector, terms))
        if not prepared:
            return
        lengths = [sum(p[6].values()) for p in prepared]
        with self._write() as db:
            self._delete(db, "collection = ? AND chunk_id = ANY(?)", (collection, [p[0] for p in prepared]))
            # Two statements for the whole batch: the chunks, then every (term, chunk) row of them.
            ids = dict(
                db.execute(
                    "INSERT INTO chunks (collection, chunk_id, doc_id, text, context, metadata, vector, length) "
                    "SELECT ?, * FROM unnest(?::text[], ?::text[], ?::text[], ?::text[], ?::text[], ?::bytea[], "
                    "?::int[]) RETURNING chunk_id, id",
                    (
                        collection,
                        [p[0] for p in prepared],
                        [p[1] for p in prepared],
                        [p[2] for p in prepared],
                        [p[3] for p in prepared],
                        [record.encode_metadata(p[4]) for p in prepared],
                        [None if p[5] is None else record.encode_vector(p[5]) for p in prepared],
                        lengths,
                    ),
                ).fetchall()
            )
            postings = [
                (term, ids[chunk_id], doc_id, tf, length)
                for (chunk_id, doc_id, *_, terms), length in zip(prepared, lengths)
                for term, tf in terms.items()
            ]
            if postings:
                db.execute(
                    "INSERT INTO lexical_terms (term, collection, chunk, doc_id, tf, length) "
                    "SELECT t, ?, c, d, f, n FROM unnest(?::text[], ?::bigint[], ?::text[], ?::int[], ?::int[]) "
                    "AS u (t, c, d, f, n)",
                    (collection, *(list(column) for column in zip(*postings))),
                )
            db.execute(
                "UPDATE lexical_stats SET chunks = chunks + ?, length = length + ? WHERE id = 1",
                (len(prepared), sum(lengths)),
            )

    @staticmethod
    def _delete(db: Any, where: str, params: tuple[Any, ...]) -> int:
        """Delete chunks (their terms go with them) and keep the index's totals; how many went."""
        ((n, length),) = db.execute(
            f"WITH gone AS (DELETE FROM chunks WHERE {where} RETURNING length) "
            "SELECT count(*), coalesce(sum(length), 0) FROM gone",
            params,
        ).fetchall()
        if n:
            db.execute("UPDATE lexical_stats SET chunks = chunks - ?, length = length - ? WHERE id = 1", (n, length))
        return int(n)

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
        """Chunks in the search index: those with terms (a chunk of no terms is never found anyway)."""
        return int(self._read("SELECT count(DISTINCT chunk) FROM lexical_terms")[0][0])

    def search_counts(self, collection: str, doc_ids: Iterable[str]) -> dict[str, int]:
        wanted = list(doc_ids)
        rows = self._read(
            "SELECT doc_id, count(DISTINCT chunk) FROM lexical_terms WHERE collection = ? AND doc_id = ANY(?) "
            "GROUP BY doc_id",
            (collection, wanted),
        )
        found = dict(rows)
        return {d: int(found.get(d, 0)) for d in wanted}

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
        n, avg_length = self._stats()
        if not n:
            return []
        weights = self._idf(terms, n)
        sql, params = _SEARCH.format(only=""), [avg_length, terms, [weights[t] for t in terms], collection, k]
        if doc_ids:
            sql = _SEARCH.format(only="AND t.doc_id = ANY(?)")
            params.insert(4, list(doc_ids))
        hits = self._read(sql, params)
        if not hits:
            return []
        found = {
            rowid: (chunk_id, doc_id)
            for rowid, chunk_id, doc_id in self._read(
                "SELECT id, chunk_id, doc_id FROM chunks WHERE id = ANY(?)", ([h[0] for h in hits],)
            )
        }
        return [LexicalHit(*found[rowid], float(score)) for rowid, score in hits if rowid in found]

    def document_chunks(self, collection: str, doc_id: str) -> list[tuple[str, dict[str, Any]]]:
        rows = self._read(
            "SELECT text, metadata FROM chunks WHERE collection = ? AND doc_id = ? ORDER BY id", (collection, doc_id)
        )
        return [(text, record.decode_metadata(meta)) for text, meta in rows]

    def idf(self, terms: Iterable[str], prior_docs: int = 1000) -> dict[str, float]:
        """BM25's idf of each term over the whole index, smoothed with `prior_docs` documents of none of
        them (as `LexicalIndex.idf`)."""
        n, _ = self._stats()
        return self._idf(sorted(set(terms)), n + prior_docs)

    # Internals.

    def _stats(self) -> tuple[int, float]:
        ((n, length),) = self._read("SELECT chunks, length FROM lexical_stats WHERE id = 1")
        return int(n), (float(length) / n if n else 1.0)

    def _idf(self, terms: list[str], n: int) -> dict[str, float]:
        df = dict(self._read("SELECT term, count(*) FROM lexical_terms WHERE term = ANY(?) GROUP BY term", (terms,)))
        return {t: math.log(1 + (n - (f := int(df.get(t, 0))) + 0.5) / (f + 0.5)) for t in terms}
