"""What the rest of the stack asks of a chunk store: `ChunkStore` (Chroma, embedded or a server) and
`PgVectorStore` (pgvector in the PostgreSQL database of RAG_DATABASE_URL) both answer it."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from rag.store.chroma_vectors import StoredChunk
from rag.store.record import Vectors


class VectorStore(Protocol):
    """Collections of chunk vectors with their text and metadata; a chunk id is "doc_id:index"."""

    default_collection: str
    damaged: dict[str, str]  # collections never to be opened (found by the start-up probe)
    out_of_step: dict[str, str]  # collections that hold fewer vectors than the catalog's indexed chunks
    unreadable: str | None  # the whole store cannot be opened

    def names(self) -> list[str]: ...

    def exists(self, name: str) -> bool: ...

    def heartbeat(self) -> bool: ...

    def close(self) -> None: ...

    def upsert(
        self,
        collection: str,
        ids: list[str],
        embeddings: Vectors | list[list[float]],
        documents: list[str],
        metadatas: list[dict[str, Any]],
    ) -> None: ...

    def loading(self, collection: str) -> AbstractContextManager[None]:
        """The writes of a bulk load into `collection` (a repair filling it) go inside this."""
        ...

    def delete_document(self, collection: str, doc_id: str) -> None: ...

    def delete_ids(self, collection: str, ids: list[str]) -> None: ...

    def delete_collection(self, name: str) -> None: ...

    def count_document(self, collection: str, doc_id: str) -> int: ...

    def count(self, collection: str) -> int: ...

    def ids(self, collection: str, step: int = 5000) -> set[str]: ...

    def get(self, collection: str, ids: list[str]) -> list[StoredChunk]: ...

    def dimensions(self, name: str) -> int | None: ...

    def vectors_of(self, collection: str, ids: list[str]) -> dict[str, Any]: ...

    def query(
        self, collection: str, embedding: list[float], k: int, doc_ids: list[str] | None = None, *, texts: bool = True
    ) -> list[StoredChunk]: ...
