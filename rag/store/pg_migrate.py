"""`rag store migrate --to postgresql://...`: copy a data dir's SQLite store into PostgreSQL.

What moves: the catalog (documents, their other names), the chunk record (text, context, metadata,
float16 vectors, each collection's embedder; each replica's BM25 index follows the record) and
the API keys. Chroma stays where it is: `rag up --replicas N` serves `data_dir/chroma` with a Chroma
server, whose vectors are the record's. A database that already holds documents is refused before
anything is copied, and the SQLite files are only read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from rag.core.errors import Conflict, NotFound
from rag.store import record
from rag.store.pg_catalog import PgDocumentCatalog
from rag.store.pg_keys import PgKeyStore
from rag.store.pg_lexical import LOCAL_DIR, PgLexicalIndex
from rag.store.postgres import shown_url

Progress = Callable[[str, int, int], None]
BATCH = 500


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def migrate_to_postgres(data_dir: Path, url: str, progress: Progress = lambda *a: None) -> dict[str, int]:
    """Copy the store of `data_dir` into the database at `url`; how many rows of each kind went."""
    catalog_file, record_file = data_dir / "catalog.sqlite", data_dir / "lexical.sqlite"
    if not catalog_file.exists() or not record_file.exists():
        raise NotFound(f"no store in {data_dir} (catalog.sqlite and lexical.sqlite)")
    catalog, lexical = PgDocumentCatalog(url), PgLexicalIndex(url, data_dir / LOCAL_DIR)
    try:
        if catalog.counts() or lexical.total():
            raise Conflict(f"the database at {shown_url(url)} holds a store already: migrate into an empty one")
        copied = {"documents": _copy_catalog(_read_only(catalog_file), catalog)}
        copied.update(_copy_record(_read_only(record_file), lexical, progress))
        keys_file = data_dir / "keys.sqlite"
        copied["keys"] = _copy_keys(_read_only(keys_file), PgKeyStore(url)) if keys_file.exists() else 0
    finally:
        catalog.close()
        lexical.close()
    return copied


def _copy_catalog(source: sqlite3.Connection, target: PgDocumentCatalog) -> int:
    from rag.store.catalog import _COLUMNS

    rows = source.execute(f"SELECT {_COLUMNS} FROM documents").fetchall()
    names = source.execute("SELECT collection, doc_id, source, name, created_at FROM document_names").fetchall()
    with target._write() as db:
        marks = ", ".join("?" * len(_COLUMNS.split(", ")))
        db.executemany(f"INSERT INTO documents ({_COLUMNS}) VALUES ({marks})", rows)
        db.executemany(
            "INSERT INTO document_names (collection, doc_id, source, name, created_at) VALUES (?, ?, ?, ?, ?)", names
        )
    return len(rows)


def _copy_record(source: sqlite3.Connection, target: PgLexicalIndex, progress: Progress) -> dict[str, int]:
    collections = [r[0] for r in source.execute("SELECT DISTINCT collection FROM chunks ORDER BY collection")]
    total = int(source.execute("SELECT count(*) FROM chunks").fetchone()[0])
    done = 0
    for collection in collections:
        cursor = source.execute(
            "SELECT chunk_id, doc_id, text, context, metadata, vector FROM chunks WHERE collection = ? ORDER BY id",
            (collection,),
        )
        while batch := cursor.fetchmany(BATCH):
            target.add(
                collection,
                [
                    (cid, did, text, ctx, record.decode_metadata(meta) if meta else None, _vector(vec))
                    for cid, did, text, ctx, meta, vec in batch
                ],
            )
            done += len(batch)
            progress("chunks", done, total)
        identity = record.read_embedder(source, collection)
        if identity is not None:
            target.set_embedder(collection, identity)
    return {"chunks": done, "collections": len(collections)}


def _vector(blob: bytes | None) -> list[float] | None:
    return None if blob is None else record.decode_vector(blob)


def _copy_keys(source: sqlite3.Connection, target: PgKeyStore) -> int:
    rows = source.execute(
        "SELECT id, secret_hash, collections, read_only, created_at, last_used FROM api_keys"
    ).fetchall()
    db = target._open(create=True)
    assert db is not None
    for row in rows:
        db.execute(
            "INSERT INTO api_keys (id, secret_hash, collections, read_only, created_at, last_used) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            row,
        )
    target.close()
    return len(rows)
