"""The chunk store: Chroma, embedded on disk (one owning process) or a `chroma run` server."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
from filelock import FileLock, Timeout

from rag.core.config import Settings
from rag.core.errors import (
    BackendUnavailable,
    NotFound,
    StoreDamaged,
    StoreLocked,
    StoreUnavailable,
    UpstreamError,
)
from rag.store.record import Vectors

log = logging.getLogger(__name__)

# sync_threshold 1: Chroma writes its HNSW files after every write. At its default (1000) the last
# writes live only in its log and are inserted again, in parallel, at each start: another graph, so
# another top 10 after a restart (16 of 20 queries kept theirs on 6,839 chunks).
HNSW = {"space": "cosine", "ef_construction": 200, "ef_search": 200, "sync_threshold": 1}
HNSW_MUTABLE = ("ef_search", "sync_threshold")  # what a collection made with other values is given on open
REPAIR_HINT = "stop the API and run `rag store repair`"
# Document ids in one Chroma `$in` filter: SQLite refuses a statement with more than 32,766 variables.
FILTER_BATCH = 5000
SHOWN_COLLECTIONS = 5  # names in the 404 of an unknown collection
_CHROMA_WIDTH = re.compile(r"expecting embedding with dimension of (\d+), got (\d+)")


def dimension_mismatch(collection: str, expected: int, got: int) -> UpstreamError:
    """A vector of another width than the collection's, from either store: the embedder is not the one
    that built the collection (the recorded-embedder check catches most of these before the store)."""
    return UpstreamError(
        f"collection {collection!r} holds {expected}-dimensional vectors; got a {got}-dimensional one: serve the "
        f"embedder that built it, or re-embed it with `rag store reindex --collection {collection}`",
        dimensions=got,
        expected=expected,
    )


def unknown_collection(name: str, known: list[str]) -> NotFound:
    """The 404 of a collection no store holds, naming a few that exist."""
    # A few names only: a store of thousands must not answer every unknown name with all of them.
    shown = ", ".join(known[:SHOWN_COLLECTIONS]) or "none yet"
    more = (
        f" and {len(known) - SHOWN_COLLECTIONS:,} more (GET /v1/collections)" if len(known) > SHOWN_COLLECTIONS else ""
    )
    return NotFound(
        f"no collection {name[:100]!r}; the collections are: {shown}{more}",
        collection=name[:100],
        collections=known[:SHOWN_COLLECTIONS],
        total=len(known),
    )


@contextmanager
def _widths_checked(collection: str) -> Iterator[None]:
    """Chroma's refusal of a vector of another width, as `dimension_mismatch`."""
    from chromadb.errors import InvalidArgumentError

    try:
        yield
    except InvalidArgumentError as exc:
        found = _CHROMA_WIDTH.search(str(exc))
        if found is None:
            raise
        raise dimension_mismatch(collection, int(found[1]), int(found[2])) from exc


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


def _chroma_settings() -> Any:
    from chromadb.config import Settings as ChromaSettings

    return ChromaSettings(anonymized_telemetry=False, allow_reset=False)


def http_client(url: str | None) -> Any:
    """A client of the Chroma server at `url`; chromadb asks the server who we are on creation, so this
    raises while the server is away."""
    import chromadb

    parts = urlparse(url or "")
    return chromadb.HttpClient(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 8000,
        ssl=parts.scheme == "https",
        settings=_chroma_settings(),
    )


def persistent_client(path: Path | str) -> Any:
    """An embedded Chroma client on `path`: the store's, the repair's and the probe's, with one set of
    settings (Chroma refuses a second client of a path with other settings in one process)."""
    import chromadb

    return chromadb.PersistentClient(path=str(path), settings=_chroma_settings())


class ChunkStore:
    """Collections of chunk vectors with their text and metadata."""

    def __init__(self, client: Any, default_collection: str = "default") -> None:
        self._client = client
        self._collections: dict[str, Any] = {}
        # Reads of the default collection before anything was ingested find it empty, not unknown.
        self.default_collection = default_collection
        # Found by the start-up probe: collections (or the whole store, client None) never to be opened
        # in this process, since opening them can crash it; and collections that lost vectors.
        self.damaged: dict[str, str] = {}
        self.out_of_step: dict[str, str] = {}
        self.unreadable: str | None = None
        # The embedded store's path: after a failed write (a full disk) its client is opened anew, since
        # chromadb's embedded writer, once it failed, blocks the next write for good (1.5.x); a new client goes on.
        self.path: Path | None = None
        self._failed_write = False
        # A Chroma server's URL: a server that was away when this process started is connected to at the
        # first use after it came (meanwhile every use is StoreUnavailable, a 503), not a crash at start.
        self.server_url: str | None = None

    @classmethod
    def open(cls, settings: Settings) -> ChunkStore:
        if settings.chroma_mode == "server":
            store = cls(None, settings.collection)
            store.server_url = settings.chroma_url
            try:
                store._connected()
            except StoreUnavailable as exc:
                log.warning("%s; connecting again at the next use", exc.message)
            return store
        settings.chroma_path.mkdir(parents=True, exist_ok=True)
        store = cls(persistent_client(settings.chroma_path), settings.collection)
        store.path = settings.chroma_path
        return store

    def _connected(self) -> Any:
        """The client; a Chroma server that was away is connected to now (StoreUnavailable while it is away)."""
        if self._client is None and self.server_url is not None:
            try:
                self._client = http_client(self.server_url)
            except Exception as exc:  # chromadb raises ValueError, httpx errors and more when the server is away
                raise StoreUnavailable(f"Chroma is unavailable: {exc}") from exc
        return self._client

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write, on a client opened anew if the last write failed."""
        if self._failed_write and self.path is not None:
            from chromadb.api.shared_system_client import SharedSystemClient

            SharedSystemClient.clear_system_cache()
            self._client, self._collections, self._failed_write = persistent_client(self.path), {}, False
        try:
            yield
        except Exception:
            self._failed_write = True
            raise

    def collection(self, name: str, *, create: bool = False) -> Any:
        """The Chroma collection `name`; only writes create it, a read of an unknown one is NotFound."""
        reason = self.unreadable or self.damaged.get(name)
        if reason is None:
            self._connected()
        if reason is not None or self._client is None:
            raise StoreDamaged(
                f"Chroma's collection {name!r} is damaged ({reason}); {REPAIR_HINT}", fix="rag store repair"
            )
        if name not in self._collections:
            from chromadb.errors import NotFoundError

            try:
                if create:
                    self._collections[name] = self._client.get_or_create_collection(
                        name, configuration={"hnsw": HNSW}, embedding_function=None
                    )
                else:
                    self._collections[name] = self._client.get_collection(name, embedding_function=None)
                _settle_hnsw(self._collections[name])
            except NotFoundError:
                raise self._unknown(name) from None
            except Exception as exc:  # chromadb raises many kinds when its server is away
                raise StoreUnavailable(f"Chroma is unavailable: {exc}") from exc
        return self._collections[name]

    def _unknown(self, name: str) -> NotFound:
        return unknown_collection(name, self.names())

    def names(self) -> list[str]:
        """The collections that exist in Chroma."""
        if self._connected() is None:
            return sorted(self.damaged)
        try:
            found = self._client.list_collections()
        except Exception as exc:  # chromadb raises many kinds when its server is away
            raise StoreUnavailable(f"Chroma is unavailable: {exc}") from exc
        return sorted(getattr(c, "name", c) for c in found)

    def exists(self, name: str) -> bool:
        try:
            self.collection(name)
        except NotFound:
            return False
        return True

    def _readable(self, name: str) -> Any | None:
        """The collection for a read; None for the default collection before its first document."""
        try:
            return self.collection(name)
        except NotFound:
            if name == self.default_collection:
                return None
            raise

    def max_batch_size(self) -> int:
        return int(self._connected().get_max_batch_size())

    @contextmanager
    def loading(self, collection: str) -> Iterator[None]:
        """A bulk write into `collection`: as any other here (Chroma builds its graph as vectors come)."""
        yield

    def close(self) -> None:
        """Nothing to close: Chroma's client lives as long as the process (its system cache holds it)."""

    def heartbeat(self) -> bool:
        try:
            client = self._connected()
            if client is None:
                return False
            client.heartbeat()
        except Exception:
            return False
        return True

    def upsert(
        self,
        collection: str,
        ids: list[str],
        embeddings: Vectors | list[list[float]],
        documents: list[str],
        metadatas: list[dict[str, Any]],
    ) -> None:
        with self._writing():
            coll = self.collection(collection, create=True)
            step = min(self.max_batch_size(), 1000)
            for start in range(0, len(ids), step):
                end = start + step
                with _widths_checked(collection):
                    coll.upsert(
                        ids=ids[start:end],
                        embeddings=embeddings[start:end],
                        documents=documents[start:end],
                        metadatas=metadatas[start:end],
                    )

    def delete_document(self, collection: str, doc_id: str) -> None:
        with self._writing():
            if self.exists(collection):
                self.collection(collection).delete(where={"doc_id": doc_id})

    def count_document(self, collection: str, doc_id: str) -> int:
        if not self.exists(collection):
            return 0
        return len(self.collection(collection).get(where={"doc_id": doc_id}, include=[])["ids"])

    def ids(self, collection: str, step: int = 5000) -> set[str]:
        """Every chunk id the collection holds."""
        coll = self._readable(collection)
        if coll is None:
            return set()
        found: set[str] = set()
        for offset in range(0, int(coll.count()), step):
            found.update(coll.get(limit=step, offset=offset, include=[])["ids"])
        return found

    def dimensions(self, name: str) -> int | None:
        """The width of the collection's vectors; None when it holds none."""
        if not self.exists(name):
            return None
        got = self.collection(name).get(limit=1, include=["embeddings"])["embeddings"]
        return None if got is None or len(got) == 0 else len(got[0])

    def vectors_of(self, collection: str, ids: list[str]) -> dict[str, Any]:
        """The vectors the collection holds of some chunk ids (what a repair compares with the record)."""
        if not ids or not self.exists(collection):
            return {}
        got = self.collection(collection).get(ids=ids, include=["embeddings"])
        return {i: np.asarray(v, dtype=np.float32) for i, v in zip(got["ids"], got["embeddings"])}

    def delete_ids(self, collection: str, ids: list[str]) -> None:
        with self._writing():
            coll = self.collection(collection)
            for start in range(0, len(ids), FILTER_BATCH):
                coll.delete(ids=ids[start : start + FILTER_BATCH])

    def count(self, collection: str) -> int:
        coll = self._readable(collection)
        return int(coll.count()) if coll is not None else 0

    def get(self, collection: str, ids: list[str]) -> list[StoredChunk]:
        coll = self._readable(collection) if ids else None
        if coll is None:
            return []
        got = coll.get(ids=ids, include=["documents", "metadatas"])
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
        coll = self._readable(collection)
        if coll is None:
            return []
        with _widths_checked(collection):
            return self._query(coll, embedding, k, doc_ids, texts)

    def _query(
        self, coll: Any, embedding: list[float], k: int, doc_ids: list[str] | None, texts: bool
    ) -> list[StoredChunk]:
        if not doc_ids:
            return _hits(coll, embedding, k, None, texts)
        # A long filter goes in parts (one SQL statement each), their hits merged by score.
        hits = [
            hit
            for start in range(0, len(doc_ids), FILTER_BATCH)
            for hit in _hits(coll, embedding, k, {"doc_id": {"$in": doc_ids[start : start + FILTER_BATCH]}}, texts)
        ]
        return sorted(hits, key=lambda h: -h.score)[:k]

    def delete_collection(self, name: str) -> None:
        self._collections.pop(name, None)
        from chromadb.errors import NotFoundError

        try:
            self._connected().delete_collection(name)
        except NotFoundError:
            pass


def _settle_hnsw(coll: Any) -> None:
    """Give a collection made before (or elsewhere) the search and sync settings of HNSW."""
    found = (getattr(coll, "configuration", None) or {}).get("hnsw") or {}
    changed = {key: HNSW[key] for key in HNSW_MUTABLE if key in found and found[key] != HNSW[key]}
    if changed:
        coll.modify(configuration={"hnsw": changed})


def _hits(coll: Any, embedding: list[float], k: int, where: dict[str, Any] | None, texts: bool) -> list[StoredChunk]:
    include = ["documents", "metadatas", "distances"] if texts else ["distances"]
    got = coll.query(query_embeddings=[embedding], n_results=k, where=where, include=include)
    ids, distances = got["ids"][0], got["distances"][0]
    documents = got["documents"][0] if texts else [None] * len(ids)
    metadatas = got["metadatas"][0] if texts else [None] * len(ids)
    hits = [
        StoredChunk(i, (doc or "") if texts else None, dict(meta or {}), 1.0 - float(dist))
        for i, doc, meta, dist in zip(ids, documents, metadatas, distances)
    ]
    return sorted(hits, key=lambda h: (-h.score, h.id))  # equal vectors in one order, whatever the graph's


@contextmanager
def store_errors() -> Iterator[None]:
    """Chroma's failures (its server away, its disk full) become StoreUnavailable."""
    import httpx
    from chromadb.errors import ChromaError

    try:
        yield
    except BackendUnavailable:
        raise
    except (ChromaError, httpx.HTTPError, ConnectionError, OSError) as exc:
        raise StoreUnavailable(f"Chroma is unavailable: {exc.__class__.__name__}: {exc}") from exc
