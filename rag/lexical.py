"""The lexical index: BM25 over SQLite FTS5, persisted and updated in place with the chunks.

Text is tokenized by us before FTS5 sees it: lower-cased words for alphabetic scripts and character
bigrams for CJK runs (Chinese has no spaces; bigrams measured better and faster than word segmentation).
FTS5 gives incremental inserts and deletes inside SQLite transactions, so an ingest that dies midway
leaves no half-written index.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+", re.UNICODE)
_IS_CJK = re.compile(rf"[{_CJK}]")


def lexical_tokens(text: str) -> list[str]:
    """Words (lower-cased) and CJK character bigrams."""
    tokens: list[str] = []
    for match in _TOKEN.finditer(text.lower()):
        run = match.group()
        if _IS_CJK.match(run):
            tokens.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
        else:
            tokens.append(run)
    return tokens


@dataclass
class LexicalHit:
    chunk_id: str
    doc_id: str
    score: float  # BM25, higher is better


class LexicalIndex:
    """BM25 search over chunks, one FTS5 table shared by all collections."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5("
            "tokens, chunk_id UNINDEXED, doc_id UNINDEXED, collection UNINDEXED, tokenize='unicode61')"
        )
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def add(self, collection: str, rows: list[tuple[str, str, str]]) -> None:
        """Index (chunk_id, doc_id, text) rows; re-adding a chunk id replaces it."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "DELETE FROM chunks_fts WHERE chunk_id = ? AND collection = ?",
                    [(chunk_id, collection) for chunk_id, _, _ in rows],
                )
                self._db.executemany(
                    "INSERT INTO chunks_fts (tokens, chunk_id, doc_id, collection) VALUES (?, ?, ?, ?)",
                    [(" ".join(lexical_tokens(text)), cid, did, collection) for cid, did, text in rows],
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def delete_document(self, collection: str, doc_id: str) -> int:
        with self._lock:
            cur = self._db.execute("DELETE FROM chunks_fts WHERE doc_id = ? AND collection = ?", (doc_id, collection))
            return cur.rowcount

    def count_document(self, collection: str, doc_id: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT count(*) FROM chunks_fts WHERE doc_id = ? AND collection = ?", (doc_id, collection)
            ).fetchone()
        return int(row[0])

    def search(self, collection: str, query: str, k: int, doc_ids: list[str] | None = None) -> list[LexicalHit]:
        terms = sorted(set(lexical_tokens(query)))
        if not terms:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        sql = "SELECT chunk_id, doc_id, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ? AND collection = ?"
        params: list[object] = [match, collection]
        if doc_ids:
            sql += f" AND doc_id IN ({','.join('?' * len(doc_ids))})"
            params += doc_ids
        sql += " ORDER BY bm25(chunks_fts) LIMIT ?"
        params.append(k)
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        # FTS5's bm25() is negated so that smaller sorts first.
        return [LexicalHit(cid, did, -score) for cid, did, score in rows]
