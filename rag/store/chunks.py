"""The chunk store: Chroma, embedded on disk (one owning process) or a `chroma run` server."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from filelock import FileLock, Timeout

from rag.core.config import Settings
from rag.core.errors import StoreLocked, StoreUnavailable

HNSW = {"space": "cosine", "ef_construction": 200, "ef_search": 200}


@dataclass
class StoredChunk:
    id: str
    text: str | None  # None when a query left texts out
    metadata: dict[str, Any]
    score: float = 0.0  # cosine similarity for dense hits


class StoreLock:
    """An exclusive lock on an embedded store's path: Chroma is not safe with two processes on one path."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / "owner.lock"
        self._lock = FileLock(str(path / ".lock"))

    def acquire(self, owner: str) -> None:
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            held_by = self.path.read_text().strip() if self.path.exists() else "another process"
            raise StoreLocked(
                f"the store at {self.path.parent} is held by {held_by}; send documents to the running API "
                "(ingest --server URL) or stop it first",
            ) from None
        self.path.write_text(f"{owner} (pid {os.getpid()})")

    def release(self) -> None:
        if self._lock.is_locked:
            self.path.unlink(missing_ok=True)
            self._lock.release()


class ChunkStore:
    """Collections of chunk vectors with their text and metadata."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._collections: dict[str, Any] = {}

    @classmethod
    def open(cls, settings: Settings) -> "ChunkStore":
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
        if settings.chroma_mode == "server":
            url = urlparse(settings.chroma_url or "")
            client = chromadb.HttpClient(
                host=url.hostname or "127.0.0.1",
                port=url.port or 8000,
                ssl=url.scheme == "https",
                settings=chroma_settings,
            )
        else:
            settings.chroma_path.mkdir(parents=True, exist_ok=True)
            client = chromadb.PersistentClient(path=str(settings.chroma_path), settings=chroma_settings)
        return cls(client)

    def collection(self, name: str) -> Any:
        if name not in self._collections:
            try:
                self._collections[name] = self._client.get_or_create_collection(
                    name, configuration={"hnsw": HNSW}, embedding_function=None
                )
            except Exception as exc:  # chromadb raises many kinds when its server is away
                raise StoreUnavailable(f"Chroma is unavailable: {exc}") from exc
        return self._collections[name]

    def max_batch_size(self) -> int:
        return int(self._client.get_max_batch_size())

    def heartbeat(self) -> bool:
        try:
            self._client.heartbeat()
        except Exception:
            return False
        return True

    def upsert(
        self,
        collection: str,
        ids: list[str],
        embeddings: list[list[float]],
        documents: list[str],
        metadatas: list[dict[str, Any]],
    ) -> None:
        coll = self.collection(collection)
        step = min(self.max_batch_size(), 1000)
        for start in range(0, len(ids), step):
            end = start + step
            coll.upsert(
                ids=ids[start:end],
                embeddings=embeddings[start:end],
                documents=documents[start:end],
                metadatas=metadatas[start:end],
            )

    def delete_document(self, collection: str, doc_id: str) -> None:
        self.collection(collection).delete(where={"doc_id": doc_id})

    def count_document(self, collection: str, doc_id: str) -> int:
        return len(self.collection(collection).get(where={"doc_id": doc_id}, include=[])["ids"])

    def count(self, collection: str) -> int:
        return int(self.collection(collection).count())

    def get(self, collection: str, ids: list[str]) -> list[StoredChunk]:
        if not ids:
            return []
        got = self.collection(collection).get(ids=ids, include=["documents", "metadatas"])
        by_id = {
            i: StoredChunk(i, doc or "", dict(meta or {}))
            for i, doc, meta in zip(got["ids"], got["documents"], got["metadatas"])
        }
        return [by_id[i] for i in ids if i in by_id]

    def query(
        self, collection: str, embedding: list[float], k: int, doc_ids: list[str] | None = None, *, texts: bool = True
    ) -> list[StoredChunk]:
        """The k nearest chunks. `texts=False` reads only ids and distances (text None, metadata empty):
        a search fetches texts for its final top k alone, not for every candidate."""
        # No count() first: Chroma answers an empty collection or a k over its size with fewer hits, and
        # the count cost 8.6 ms p50 (25 ms p95) per query at 100k chunks.
        where = {"doc_id": {"$in": doc_ids}} if doc_ids else None
        include = ["documents", "metadatas", "distances"] if texts else ["distances"]
        got = self.collection(collection).query(query_embeddings=[embedding], n_results=k, where=where, include=include)
        ids, distances = got["ids"][0], got["distances"][0]
        documents = got["documents"][0] if texts else [None] * len(ids)
        metadatas = got["metadatas"][0] if texts else [None] * len(ids)
        return [
            StoredChunk(i, (doc or "") if texts else None, dict(meta or {}), 1.0 - float(dist))
            for i, doc, meta, dist in zip(ids, documents, metadatas, distances)
        ]

    def delete_collection(self, name: str) -> None:
        self._collections.pop(name, None)
        from chromadb.errors import NotFoundError

        try:
            self._client.delete_collection(name)
        except NotFoundError:
            pass
