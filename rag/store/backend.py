"""Which backend holds the catalog, the chunk record, the keys and the owner lease: SQLite files in the data
dir (the default), or the PostgreSQL database of RAG_DATABASE_URL that several API replicas share; and
which holds the vectors: Chroma (the default), or pgvector in that database (RAG_VECTOR_STORE)."""

from __future__ import annotations

from rag.core.config import Settings
from rag.store._lease import OwnerLease
from rag.store.catalog import DocumentCatalog
from rag.store.chunk_record import LexicalIndex
from rag.store.keys import FILE as KEYS_FILE
from rag.store.keys import KeyStore
from rag.store.vectors import VectorStore


def open_catalog(settings: Settings) -> DocumentCatalog:
    if settings.database_url:
        from rag.store.pg_catalog import PgDocumentCatalog

        return PgDocumentCatalog(settings.database_url)
    return DocumentCatalog(settings.data_dir / "catalog.sqlite")


def open_lexical(settings: Settings) -> LexicalIndex:
    if settings.database_url:
        from rag.store.pg_lexical import LOCAL_DIR, PgLexicalIndex

        # the record in the database, this replica's BM25 index following it in the data dir
        return PgLexicalIndex(settings.database_url, settings.data_dir / LOCAL_DIR)  # type: ignore[return-value]
    return LexicalIndex(settings.data_dir / "lexical.sqlite")


def open_lease(settings: Settings) -> OwnerLease:
    if settings.database_url:
        from rag.store.postgres import PgOwnerLease

        return PgOwnerLease(settings.database_url, settings.embed_model)  # type: ignore[return-value]  # the same calls
    return OwnerLease(settings.data_dir / "owners")


def open_keys(settings: Settings) -> KeyStore:
    if settings.database_url:
        from rag.store.pg_keys import PgKeyStore

        return PgKeyStore(settings.database_url)
    return KeyStore(settings.data_dir / KEYS_FILE)


def open_vectors(settings: Settings) -> VectorStore:
    """The chunk store, unprobed: pgvector in RAG_DATABASE_URL's database, else Chroma (embedded or a server)."""
    if settings.vector_store == "pgvector":
        from rag.store.pg_vectors import PgVectorStore

        assert settings.database_url is not None  # Settings refuses pgvector without it
        return PgVectorStore(settings.database_url, settings.collection)
    from rag.store.chroma_vectors import ChunkStore

    return ChunkStore.open(settings)
