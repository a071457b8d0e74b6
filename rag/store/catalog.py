"""The document catalog: one row per (collection, document) with its ingestion state, in SQLite.

    pending  ──► indexed ──► deleting ──► (row removed)
     │  ▲                       ▲
     ▼  │                       │
    failed ─────────────────────┘

A failed row is claimed again (back to `pending`) when its file comes again, or deleted like an
indexed one.

Only `indexed` documents are searchable: retrieval asks `indexed_names()` and drops hits of any other
document. A new version of a source becomes searchable, and the old one unsearchable, in one SQLite
transaction (`mark_indexed`); the old version's chunks are deleted after. A process that dies leaves
`pending` or `deleting` rows whose owner lease is free: `leftovers()` finds them for clean-up.

The same bytes under two sources are one document (its id is the content's hash, its chunks stored
once) with two names: the row's own source and name, and a row of `document_names` for each other
one. Retiring or deleting one name keeps the content while another names it.

What a user counts as a document is one content of a collection, indexed, with its names beneath it
(`documents`, `counts`); a failed file is a failure, counted and listed apart (`state="failed"`), never
as a document. The API, `rag store check`, `ingest --json` and the web page all take these numbers.
"""

from __future__ import annotations

import builtins
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal

from rag.core.config import COLLECTION_NAME
from rag.core.errors import Conflict, InvalidRequest, NotFound, TooManyCollections
from rag.store._document_record import DocumentCounts, DocumentRecord, State
from rag.store._lease import OwnerLease
from rag.store.schema import Step, migrate, run_script
from rag.store.sqlite import BUSY_TIMEOUT_S, write_transaction

__all__ = [
    "Claim",
    "DocumentBusy",
    "DocumentCatalog",
    "DocumentCounts",
    "DocumentRecord",
    "IsLive",
    "OwnerLease",
    "State",
    "check_collection",
]

IsLive = Callable[[str | None], bool]  # whether the owner token of a row belongs to a running process

Claim = Literal["claimed", "indexed", "busy"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    collection TEXT NOT NULL,
    doc_id     TEXT NOT NULL,
    source     TEXT NOT NULL,
    name       TEXT NOT NULL,
    size       INTEGER NOT NULL,
    pages      INTEGER,
    chunks     INTEGER NOT NULL DEFAULT 0,
    state      TEXT NOT NULL CHECK (state IN ('pending', 'indexed', 'failed', 'deleting')),
    error      TEXT,
    owner      TEXT,
    created_at REAL NOT NULL,
    indexed_at REAL,
    PRIMARY KEY (collection, doc_id)
);
CREATE INDEX IF NOT EXISTS documents_by_source ON documents (collection, source);
CREATE INDEX IF NOT EXISTS documents_by_state ON documents (state);
CREATE TABLE IF NOT EXISTS document_names (
    collection TEXT NOT NULL,
    doc_id     TEXT NOT NULL,
    source     TEXT NOT NULL,
    name       TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (collection, doc_id, source)
);
CREATE INDEX IF NOT EXISTS document_names_by_source ON document_names (collection, source);
"""
_STEPS: list[Step] = [("documents and their names", lambda db: run_script(db, _SCHEMA))]


def check_collection(name: str) -> str:
    """`name` if Chroma accepts it as a collection name; InvalidRequest otherwise."""
    if not COLLECTION_NAME.fullmatch(name):
        raise InvalidRequest(f"collection name {name[:80]!r} must be 3-512 characters of letters, digits, '._-'")
    return name


_COLUMNS = "collection, doc_id, source, name, size, pages, chunks, state, error, owner, created_at, indexed_at"
_REPLACE = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS.split(", ")[2:])  # a claim's row replaces the old
# Every name of every document: the rows themselves, and their other names with the row's state.
_NAMED = f"""(
    SELECT {_COLUMNS} FROM documents
    UNION ALL
    SELECT d.collection, d.doc_id, n.source, n.name, d.size, d.pages, d.chunks, d.state, d.error, d.owner,
           n.created_at, d.indexed_at
    FROM document_names n JOIN documents d ON d.collection = n.collection AND d.doc_id = n.doc_id
)"""


class DocumentCatalog:
    """Per-collection document rows; safe for threads and for several processes on one file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        migrate(self._db, path, _STEPS)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction; IMMEDIATE takes the write lock up front so reads inside it are current."""
        return write_transaction(self._db, self._lock)

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[DocumentRecord]:
        with self._lock:
            rows = self._db.execute(sql, tuple(params)).fetchall()
        return [DocumentRecord(*row) for row in rows]

    # Reads.

    def get(self, collection: str, doc_id: str) -> DocumentRecord | None:
        rows = self._rows(f"SELECT {_COLUMNS} FROM documents WHERE collection = ? AND doc_id = ?", (collection, doc_id))
        return rows[0] if rows else None

    def list(
        self, collection: str, offset: int = 0, limit: int = 50, state: State | None = None
    ) -> list[DocumentRecord]:
        """Every name of the collection's rows, one row per name (what `ingest --sync` compares with files)."""
        sql = f"SELECT {_COLUMNS} FROM {_NAMED} WHERE collection = ?"
        params: list[Any] = [collection]
        if state:
            sql += " AND state = ?"
            params.append(state)
        sql += " ORDER BY created_at, doc_id LIMIT ? OFFSET ?"
        return self._rows(sql, [*params, limit, offset])

    def documents(
        self, collection: str, offset: int = 0, limit: int = 50, state: State = "indexed"
    ) -> builtins.list[DocumentRecord]:
        """The collection's contents in `state`, oldest first, one row each (its own name; `names` has all)."""
        return self._rows(
            f"SELECT {_COLUMNS} FROM documents WHERE collection = ? AND state = ? "
            "ORDER BY created_at, doc_id LIMIT ? OFFSET ?",
            (collection, state, limit, offset),
        )

    def counts(self) -> dict[str, DocumentCounts]:
        """Every collection with a row: its documents (indexed contents) and its failures."""
        with self._lock:
            rows = self._db.execute(
                "SELECT collection, sum(CASE WHEN state = 'indexed' THEN 1 ELSE 0 END), "
                "sum(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) FROM documents GROUP BY collection"
            ).fetchall()
        return {name: DocumentCounts(int(n or 0), int(f or 0)) for name, n, f in sorted(rows)}

    def count_in(self, collection: str, state: State = "indexed") -> int:
        """How many contents of the collection are in `state` (indexed: its documents)."""
        with self._lock:
            return int(
                self._db.execute(
                    "SELECT count(*) FROM documents WHERE collection = ? AND state = ?", (collection, state)
                ).fetchone()[0]
            )

    def names_of(self, collection: str, doc_ids: Iterable[str]) -> dict[str, builtins.list[tuple[str, str]]]:
        """(source, display name) of every name of each document: its own first, then the others by age."""
        found: dict[str, builtins.list[tuple[str, str]]] = {}
        wanted = list(dict.fromkeys(doc_ids))
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            marks = ",".join("?" * len(part))
            with self._lock:
                rows = self._db.execute(
                    f"SELECT doc_id, source, name, 0, created_at FROM documents WHERE collection = ? AND doc_id IN ({marks}) "
                    f"UNION ALL SELECT doc_id, source, name, 1, created_at FROM document_names "
                    f"WHERE collection = ? AND doc_id IN ({marks}) ORDER BY 1, 4, 5",
                    (collection, *part, collection, *part),
                ).fetchall()
            for doc_id, source, name, _, _ in rows:
                found.setdefault(doc_id, []).append((source, name))
        return found

    def by_source(self, collection: str, source: str) -> builtins.list[DocumentRecord]:
        return self._rows(
            f"SELECT {_COLUMNS} FROM {_NAMED} WHERE collection = ? AND source = ? ORDER BY created_at",
            (collection, source),
        )

    def names(self, collection: str, doc_id: str) -> builtins.list[str]:
        """The sources that name a document: its own first, then the others by age."""
        with self._lock:
            rows = self._db.execute(
                "SELECT source FROM documents WHERE collection = ? AND doc_id = ? UNION ALL "
                "SELECT source FROM (SELECT source FROM document_names WHERE collection = ? AND doc_id = ? "
                "ORDER BY created_at)",
                (collection, doc_id, collection, doc_id),
            ).fetchall()
        return [r[0] for r in rows]

    def collections(self) -> builtins.list[tuple[str, int]]:
        """Every collection with a row, and how many documents (indexed contents) it holds."""
        return [(name, c.documents) for name, c in self.counts().items()]

    def check_room(self, collection: str, limit: int) -> None:
        """TooManyCollections when `collection` would be new and `limit` collections exist already."""
        with self._lock:
            known = self._db.execute("SELECT 1 FROM documents WHERE collection = ? LIMIT 1", (collection,)).fetchone()
            count = 0 if known else self._db.execute("SELECT count(DISTINCT collection) FROM documents").fetchone()[0]
        if not known and count >= limit:
            raise TooManyCollections(
                f"collection {collection!r} would be new, and the store holds {count:,} collections, its limit "
                f"(RAG_MAX_COLLECTIONS); add to an existing one or delete one",
                limit=limit,
            )

    def indexed_chunks(self, collection: str) -> dict[str, int]:
        """Every indexed document of the collection with its number of chunks."""
        with self._lock:
            rows = self._db.execute(
                "SELECT doc_id, chunks FROM documents WHERE collection = ? AND state = 'indexed'", (collection,)
            ).fetchall()
        return {doc_id: int(n) for doc_id, n in rows}

    def indexed_ids(self, collection: str, doc_ids: Iterable[str]) -> set[str]:
        """The subset of `doc_ids` that is searchable now."""
        return set(self.indexed_names(collection, doc_ids))

    def indexed_names(self, collection: str, doc_ids: Iterable[str]) -> dict[str, str]:
        """The searchable documents among `doc_ids`, each with its own (display) name now."""
        wanted = list(dict.fromkeys(doc_ids))
        found: dict[str, str] = {}
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            with self._lock:
                rows = self._db.execute(
                    f"SELECT doc_id, name FROM documents WHERE collection = ? AND state = 'indexed' "
                    f"AND doc_id IN ({','.join('?' * len(part))})",
                    (collection, *part),
                ).fetchall()
            found.update(rows)
        return found

    def leftovers(self, is_live: IsLive) -> builtins.list[DocumentRecord]:
        """Pending and deleting rows whose owner is gone: their chunks may be half written or half deleted."""
        rows = self._rows(f"SELECT {_COLUMNS} FROM documents WHERE state IN ('pending', 'deleting')")
        return [r for r in rows if not is_live(r.owner)]

    # Writes.

    def claim(
        self, collection: str, doc_id: str, *, source: str, name: str, size: int, owner: str, is_live: IsLive
    ) -> tuple[Claim, DocumentRecord | None]:
        """Mark a document pending for `owner`, unless it is indexed already or another live owner has it.

        Returns the claim and the row as it was before (a failed or abandoned row's chunks need removal).
        """
        now = time.time()
        with self._write() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM documents WHERE collection = ? AND doc_id = ?", (collection, doc_id)
            ).fetchone()
            before = DocumentRecord(*row) if row else None
            if before and before.state == "indexed":
                return "indexed", before
            if before and before.state in ("pending", "deleting") and is_live(before.owner):
                return "busy", before
            db.execute(
                f"INSERT INTO documents ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL, 0, 'pending', NULL, ?, ?, NULL) "
                f"ON CONFLICT (collection, doc_id) DO UPDATE SET {_REPLACE}",
                (collection, doc_id, source, name, size, owner, now),
            )
        return "claimed", before

    def mark_indexed(
        self, collection: str, doc_id: str, *, chunks: int, pages: int | None, owner: str
    ) -> builtins.list[str]:
        """Make the document searchable and retire every other indexed version of its source, atomically.

        Returns the retired documents' ids (now `deleting`, owned by `owner`): delete their chunks, then
        `remove` them.
        """
        with self._write() as db:
            (source,) = db.execute(
                "SELECT source FROM documents WHERE collection = ? AND doc_id = ?", (collection, doc_id)
            ).fetchone()
            db.execute(
                "UPDATE documents SET state = 'indexed', chunks = ?, pages = ?, error = NULL, owner = NULL, "
                "indexed_at = ? WHERE collection = ? AND doc_id = ?",
                (chunks, pages, time.time(), collection, doc_id),
            )
            return self._retire(db, collection, source, keep=doc_id, owner=owner)

    def retire_source(self, collection: str, source: str, *, keep: str, owner: str) -> builtins.list[str]:
        """Retire the indexed versions of `source` other than `keep` (whose content is indexed already)."""
        with self._write() as db:
            return self._retire(db, collection, source, keep=keep, owner=owner)

    @classmethod
    def _retire(
        cls, db: sqlite3.Connection, collection: str, source: str, *, keep: str, owner: str
    ) -> builtins.list[str]:
        """Take the name `source` from every indexed document but `keep`; those left unnamed go."""
        named = db.execute(
            "SELECT doc_id FROM documents WHERE collection = ? AND source = ? AND doc_id != ? AND state = 'indexed' "
            "UNION SELECT n.doc_id FROM document_names n JOIN documents d USING (collection, doc_id) "
            "WHERE n.collection = ? AND n.source = ? AND n.doc_id != ? AND d.state = 'indexed'",
            (collection, source, keep, collection, source, keep),
        ).fetchall()
        old = [doc_id for (doc_id,) in named if not cls._drop_name(db, collection, doc_id, source)]
        db.executemany(
            "UPDATE documents SET state = 'deleting', owner = ? WHERE collection = ? AND doc_id = ?",
            [(owner, collection, d) for d in old],
        )
        return old

    @staticmethod
    def _drop_name(db: sqlite3.Connection, collection: str, doc_id: str, source: str) -> bool:
        """Remove one name of a document that has others; False (nothing done) when it is the only one."""
        if db.execute(
            "DELETE FROM document_names WHERE collection = ? AND doc_id = ? AND source = ?",
            (collection, doc_id, source),
        ).rowcount:
            return True
        other = db.execute(
            "SELECT source, name FROM document_names WHERE collection = ? AND doc_id = ? ORDER BY created_at LIMIT 1",
            (collection, doc_id),
        ).fetchone()
        if other is None:
            return False
        # The row's own name goes: the oldest other name takes its place.
        db.execute(
            "UPDATE documents SET source = ?, name = ? WHERE collection = ? AND doc_id = ?",
            (*other, collection, doc_id),
        )
        db.execute(
            "DELETE FROM document_names WHERE collection = ? AND doc_id = ? AND source = ?",
            (collection, doc_id, other[0]),
        )
        return True

    def add_name(self, collection: str, doc_id: str, *, source: str, name: str) -> None:
        """Record `source` as another name of an indexed document (the same bytes under a second name)."""
        with self._write() as db:
            row = db.execute(
                "SELECT source FROM documents WHERE collection = ? AND doc_id = ?", (collection, doc_id)
            ).fetchone()
            if row is None:
                return
            if row[0] == source:  # its own name: the display name may have changed
                db.execute(
                    "UPDATE documents SET name = ? WHERE collection = ? AND doc_id = ?", (name, collection, doc_id)
                )
                return
            db.execute(
                "INSERT INTO document_names (collection, doc_id, source, name, created_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (collection, doc_id, source) DO UPDATE SET name = excluded.name",
                (collection, doc_id, source, name, time.time()),
            )

    def drop_name(self, collection: str, doc_id: str, source: str) -> bool:
        """Remove one name of a document; False when it is the document's only name (delete it instead)."""
        with self._write() as db:
            names = db.execute(
                f"SELECT count(*) FROM {_NAMED} WHERE collection = ? AND doc_id = ? AND source = ?",
                (collection, doc_id, source),
            ).fetchone()[0]
            if not names:
                raise NotFound(f"document {doc_id} has no source {source[:200]!r}")
            return self._drop_name(db, collection, doc_id, source)

    def mark_failed(self, collection: str, doc_id: str, error: str) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE documents SET state = 'failed', error = ?, owner = NULL, chunks = 0 "
                "WHERE collection = ? AND doc_id = ?",
                (error[:2000], collection, doc_id),
            )

    def mark_deleting(self, collection: str, doc_id: str, *, owner: str, is_live: IsLive) -> DocumentRecord | None:
        """Take a document out of search before its chunks are deleted; None if it does not exist.

        Raises `DocumentBusy` when a live process is indexing or deleting it.
        """
        with self._write() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM documents WHERE collection = ? AND doc_id = ?", (collection, doc_id)
            ).fetchone()
            if row is None:
                return None
            record = DocumentRecord(*row)
            if record.state in ("pending", "deleting") and is_live(record.owner):
                raise DocumentBusy(record)
            db.execute(
                "UPDATE documents SET state = 'deleting', owner = ? WHERE collection = ? AND doc_id = ?",
                (owner, collection, doc_id),
            )
        return record

    def remove(self, collection: str, doc_id: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM documents WHERE collection = ? AND doc_id = ?", (collection, doc_id))
            db.execute("DELETE FROM document_names WHERE collection = ? AND doc_id = ?", (collection, doc_id))


class DocumentBusy(Conflict):
    """Another live process (or request) is indexing or deleting this document."""

    def __init__(self, record: DocumentRecord) -> None:
        super().__init__(f"document {record.doc_id} is {record.state} in another request; retry when it is done")
        self.record = record
