"""The lexical index: BM25 over SQLite FTS5, persisted and updated in place with the chunks.

Text is tokenized by us before FTS5 sees it: CJK runs become character bigrams (Chinese has no spaces;
bigrams measured better and 6x faster to index than jieba words), other words are lower-cased, English
stop words dropped and ASCII words Snowball-stemmed ("founded" finds "founding"). FTS5 gives incremental
inserts and deletes inside SQLite transactions, so an ingest that dies midway leaves no half-written index.

The raw chunk text is kept beside the tokens, so that an index written with another tokenizer is
re-tokenized in place when it is opened, never silently searched with mismatched tokens.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import Stemmer

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+", re.UNICODE)
_IS_CJK = re.compile(rf"[{_CJK}]")

# Lucene's English stop words, question words and the one-letter leftovers of contractions ("don't").
# BM25 weighs them near zero anyway; dropping them keeps OR queries off the longest posting lists.
STOPWORDS_EN = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with what which who whom whose when where why how do does did has have had were "
    "been being s t".split()
)

_local = threading.local()


def _stemmer() -> Stemmer.Stemmer:
    # A Snowball stemmer keeps state: one per thread.
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    return stemmer


def cjk_fraction(text: str) -> float:
    """The share of CJK characters among the letters and digits of `text`."""
    letters = sum(len(m.group()) for m in _TOKEN.finditer(text))
    return len(_IS_CJK.findall(text)) / letters if letters else 0.0


@dataclass(frozen=True)
class Tokenizer:
    """Words for alphabetic scripts (optionally stop-worded and stemmed), character bigrams for CJK."""

    stem: bool = True
    stopwords: bool = True

    @property
    def name(self) -> str:
        return "cjk2+words" + ("+stop" if self.stopwords else "") + ("+stem" if self.stem else "")

    def __call__(self, text: str) -> list[str]:
        tokens: list[str] = []
        words: list[str] = []
        for match in _TOKEN.finditer(text.lower()):
            run = match.group()
            if _IS_CJK.match(run):
                tokens.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
            elif not (self.stopwords and run in STOPWORDS_EN):
                (words if self.stem and run.isascii() else tokens).append(run)
        if words:
            tokens.extend(_stemmer().stemWords(words))
        return tokens


lexical_tokens = Tokenizer()


@dataclass
class LexicalHit:
    chunk_id: str
    doc_id: str
    score: float  # BM25, higher is better


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    collection TEXT NOT NULL,
    chunk_id TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    text TEXT NOT NULL,
    UNIQUE (collection, chunk_id)
);
CREATE INDEX IF NOT EXISTS chunks_by_doc ON chunks (collection, doc_id);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(tokens, tokenize='unicode61 remove_diacritics 2');
"""


class LexicalIndex:
    """BM25 search over chunks. One FTS5 table shared by all collections, its rowids those of `chunks`."""

    def __init__(self, path: Path, tokenizer: Tokenizer = lexical_tokens) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tokenizer = tokenizer
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.Lock()
        self._db.executescript(_SCHEMA)
        with self._transaction():
            self._retokenize_if_needed()
        # Searches read through their own connection: under WAL they see the last commit and never
        # wait for an ingest's write transaction.
        self._reader = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._read_lock = threading.Lock()

    def close(self) -> None:
        self._reader.close()
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN ... COMMIT under the index's lock; ROLLBACK on any exception."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _retokenize_if_needed(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'tokenizer'").fetchone()
        if row and row[0] == self.tokenizer.name:
            return
        if row:  # written by another tokenizer: rebuild the tokens from the stored text
            self._db.execute("DELETE FROM chunks_fts")
            rows = self._db.execute("SELECT id, text FROM chunks").fetchall()
            self._db.executemany(
                "INSERT INTO chunks_fts (rowid, tokens) VALUES (?, ?)",
                [(rowid, " ".join(self.tokenizer(text))) for rowid, text in rows],
            )
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('tokenizer', ?)", (self.tokenizer.name,))

    def add(self, collection: str, rows: Iterable[tuple[str, str, str]]) -> None:
        """Index (chunk_id, doc_id, text) rows; re-adding a chunk id replaces it."""
        prepared = [(cid, did, text, " ".join(self.tokenizer(text))) for cid, did, text in rows]
        with self._transaction():
            for chunk_id, doc_id, text, tokens in prepared:
                self._delete_rows("WHERE collection = ? AND chunk_id = ?", (collection, chunk_id))
                cur = self._db.execute(
                    "INSERT INTO chunks (collection, chunk_id, doc_id, text) VALUES (?, ?, ?, ?)",
                    (collection, chunk_id, doc_id, text),
                )
                self._db.execute("INSERT INTO chunks_fts (rowid, tokens) VALUES (?, ?)", (cur.lastrowid, tokens))

    def _delete_rows(self, where: str, params: tuple[str, ...]) -> int:
        self._db.execute(f"DELETE FROM chunks_fts WHERE rowid IN (SELECT id FROM chunks {where})", params)
        return self._db.execute(f"DELETE FROM chunks {where}", params).rowcount

    def delete_document(self, collection: str, doc_id: str) -> int:
        with self._transaction():
            return self._delete_rows("WHERE collection = ? AND doc_id = ?", (collection, doc_id))

    def delete_collection(self, collection: str) -> int:
        with self._transaction():
            return self._delete_rows("WHERE collection = ?", (collection,))

    def count_document(self, collection: str, doc_id: str) -> int:
        with self._read_lock:
            row = self._reader.execute(
                "SELECT count(*) FROM chunks WHERE collection = ? AND doc_id = ?", (collection, doc_id)
            ).fetchone()
        return int(row[0])

    def count(self, collection: str) -> int:
        with self._read_lock:
            row = self._reader.execute("SELECT count(*) FROM chunks WHERE collection = ?", (collection,)).fetchone()
        return int(row[0])

    def search(self, collection: str, query: str, k: int, doc_ids: list[str] | None = None) -> list[LexicalHit]:
        """The k best chunks by BM25 for any of the query's terms, optionally within some documents."""
        terms = sorted(set(self.tokenizer(query)))
        if not terms or k <= 0:
            return []
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        sql = (
            "SELECT c.chunk_id, c.doc_id, f.rank FROM chunks_fts f JOIN chunks c ON c.id = f.rowid"
            " WHERE chunks_fts MATCH ? AND c.collection = ?"
        )
        params: list[object] = [match, collection]
        if doc_ids:
            sql += f" AND c.doc_id IN ({','.join('?' * len(doc_ids))})"
            params += doc_ids
        sql += " ORDER BY f.rank LIMIT ?"
        params.append(k)
        with self._read_lock:
            rows = self._reader.execute(sql, params).fetchall()
        # FTS5's rank is bm25() negated so that smaller sorts first.
        return [LexicalHit(cid, did, -score) for cid, did, score in rows]

