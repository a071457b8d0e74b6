"""Where a document's chunks go and how they leave: Chroma, the lexical record and index, and the
catalog row that says what is searchable."""

from __future__ import annotations

from ingest._lexical_context import lexical_context
from ingest._records import ChunkRecord
from ingest.originals import Originals
from rag.store.catalog import DocumentCatalog
from rag.store.chroma_vectors import store_errors
from rag.store.chunk_record import LexicalIndex
from rag.store.record import EmbedderIdentity, Vectors, rounded
from rag.store.vectors import VectorStore


class DocumentStores:
    """The stores one pipeline writes, with the order of writes that keeps them free of orphans."""

    def __init__(
        self,
        store: VectorStore,
        lexical: LexicalIndex,
        catalog: DocumentCatalog,
        embed_model: str,
        originals: Originals | None = None,
    ) -> None:
        self.store = store
        self.originals = originals
        self.lexical = lexical
        self.catalog = catalog
        self.embed_model = embed_model

    def write_chunks(self, collection: str, records: list[ChunkRecord], vectors: Vectors) -> None:
        vectors = rounded(vectors)
        with store_errors():
            self.store.upsert(
                collection,
                ids=[r.id for r in records],
                embeddings=vectors,
                documents=[r.text for r in records],
                metadatas=[r.metadata for r in records],
            )
        rows = [
            (r.id, str(r.metadata["doc_id"]), r.text, lexical_context(r.metadata), r.metadata, v)
            for r, v in zip(records, vectors)
        ]
        self.lexical.add(collection, rows)
        if records and self.lexical.embedder(collection) is None:
            identity = EmbedderIdentity.of(self.embed_model, records[0].text, vectors[0])
            self.lexical.set_embedder(collection, identity)

    def delete_chunks(self, collection: str, doc_id: str) -> None:
        with store_errors():
            self.store.delete_document(collection, doc_id)
        self.lexical.delete_document(collection, doc_id)
        if self.originals is not None:
            self.originals.delete(collection, doc_id)

    def save_original(self, collection: str, doc_id: str, data: bytes) -> None:
        """Keep a document's bytes to show its pages (before it is searchable: a citation can open them)."""
        if self.originals is not None:
            self.originals.save(collection, doc_id, data)

    def purge(self, collection: str, doc_id: str) -> None:
        """Delete a document's chunks everywhere, then its catalog row (in that order: no orphans)."""
        self.delete_chunks(collection, doc_id)
        self.catalog.remove(collection, doc_id)
