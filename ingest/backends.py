"""Where the `ingest` CLI sends documents: the running API, or the store directly when no API holds it.

Chroma must never be opened by two processes on one path. The API owns the embedded store, so while
it runs the CLI uploads through it (`ApiBackend`); with no API up the CLI opens the store itself under
the same lock (`LocalBackend`), or talks to a Chroma server (RAG_CHROMA_MODE=server) without one.
Both run the same pipeline: the API's upload endpoint runs `IngestPipeline` too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from rag.core.config import Settings
from rag.core.errors import (
    BackendUnavailable,
    Conflict,
    InvalidRequest,
    NotFound,
    RagError,
    Unauthorized,
    UpstreamError,
)
from rag.store.catalog import DocumentCounts

from .embedder import embedder_for
from .pipeline import FileResult, Progress, SourceFile, document_id


@dataclass
class KnownDocument:
    """A document as the backend's catalog lists it."""

    id: str
    source: str
    state: str


class Backend(Protocol):
    name: str

    async def ingest(self, files: Sequence[SourceFile], collection: str, progress: Progress) -> list[FileResult]: ...
    async def documents(self, collection: str) -> list[KnownDocument]: ...
    async def state_of(self, collection: str, doc_id: str) -> str | None: ...
    async def delete(self, collection: str, doc_id: str, source: str | None = None) -> None: ...
    async def counts(self, collection: str) -> DocumentCounts: ...


def file_id(path: Path) -> str:
    return document_id(path.read_bytes())


class DeferredStore:
    """A store opened in a background thread: Chroma's import and start-up (0.7 s here) overlap loading
    and embedding the first files, which do not need it. Every use waits for it (from worker threads)."""

    def __init__(self, open_store: Callable[[Settings], Any], settings: Settings) -> None:
        self._opening = ThreadPoolExecutor(1, thread_name_prefix="open-store").submit(open_store, settings)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._opening.result(), name)


class LocalBackend:
    """The store opened by this process: the embedded one under its lock, or a Chroma server."""

    name = "local"

    def __init__(
        self, settings: Settings, *, read_only: bool = False, own_embedder: Callable[[str], None] | None = None
    ) -> None:
        self.settings = settings
        self.read_only = read_only
        # When set, an embedding server is started for this run if none answers (and told through it).
        self.own_embedder = own_embedder
        self._stack = AsyncExitStack()
        self.pipeline: Any = None
        self.catalog: Any = None

    async def __aenter__(self) -> LocalBackend:
        from rag.store.backend import open_catalog

        self.catalog = open_catalog(self.settings)
        self._stack.callback(self.catalog.close)
        if not self.read_only:
            try:
                await asyncio.to_thread(self._lock_store)
                if self.own_embedder is not None:  # after the lock: a held store fails before a slow start
                    self.settings = await self._stack.enter_async_context(
                        embedder_for(self.settings, self.own_embedder)
                    )
                await asyncio.to_thread(self._open_store)
            except BaseException:
                await self._stack.aclose()
                raise
        return self

    def _lock_store(self) -> None:
        from rag.store.chroma_vectors import StoreLock

        if self.settings.embedded_chroma:
            lock = StoreLock(self.settings.data_dir)
            lock.acquire("the ingest CLI")
            self._stack.callback(lock.release)

    def _open_store(self) -> None:
        from rag.clients.embedding_pool import embedding_client
        from rag.store.backend import open_lease, open_lexical, open_vectors

        from .pipeline import IngestPipeline

        store = DeferredStore(open_vectors, self.settings)
        self._stack.callback(lambda: store.close())
        lexical = open_lexical(self.settings)
        self._stack.callback(lexical.close)
        lease = open_lease(self.settings)
        self._stack.callback(lease.release)
        embedder = embedding_client(
            self.settings.embed_urls, model=self.settings.embed_model, stall_s=self.settings.probe_timeout_s
        )
        self._stack.push_async_callback(embedder.aclose)
        self.pipeline = IngestPipeline(self.settings, embedder, store, lexical, self.catalog, lease)
        self.pipeline.recover()

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def ingest(self, files: Sequence[SourceFile], collection: str, progress: Progress) -> list[FileResult]:
        results: list[FileResult] = await self.pipeline.run(files, collection, progress)
        return results

    async def documents(self, collection: str) -> list[KnownDocument]:
        records = await asyncio.to_thread(self.catalog.list, collection, 0, 1 << 62)
        return [KnownDocument(r.doc_id, r.source, r.state) for r in records]

    async def state_of(self, collection: str, doc_id: str) -> str | None:
        record = await asyncio.to_thread(self.catalog.get, collection, doc_id)
        return record.state if record else None

    async def delete(self, collection: str, doc_id: str, source: str | None = None) -> None:
        await self.pipeline.delete(collection, doc_id, source)

    async def counts(self, collection: str) -> DocumentCounts:
        """The collection's documents and failures, counted as the API counts them."""
        counts: dict[str, DocumentCounts] = await asyncio.to_thread(self.catalog.counts)
        return counts.get(collection, DocumentCounts())


class ApiBackend:
    """The documents API of a running `rag` server, over HTTP."""

    name = "api"

    def __init__(
        self, url: str, settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None, inflight: int = 2
    ) -> None:
        self.url = url.rstrip("/")
        self.settings = settings
        headers = {}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        timeout = httpx.Timeout(connect=5.0, read=None, write=300.0, pool=None)  # a big upload indexes for long
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        self._inflight = inflight
        self.files_per_request = 8 * settings.embed_batch

    async def __aenter__(self) -> ApiBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def ingest(self, files: Sequence[SourceFile], collection: str, progress: Progress) -> list[FileResult]:
        """Upload the files in groups (a few requests in flight, so the server's embedder never idles)."""
        results: dict[SourceFile, FileResult] = {}
        limit = asyncio.Semaphore(self._inflight)

        async def send(group: list[SourceFile]) -> None:
            async with limit:
                for file in group:
                    progress.file_started(file)
                for file, result in zip(group, await self._upload(group, collection)):
                    results[file] = result
                    progress.chunks_stored(result.chunks if result.status == "indexed" else 0)
                    progress.file_done(result)

        async with asyncio.TaskGroup() as tasks:
            for group in self._groups(files):
                tasks.create_task(send(group))
        return [results[f] for f in files]

    def _groups(self, files: Sequence[SourceFile]) -> list[list[SourceFile]]:
        """Files in upload requests of at most `files_per_request` files and `max_upload_bytes` in all.

        The server runs one pipeline per request, which batches and length-sorts only that request's
        chunks: small requests would mean small, padded embedding batches.
        """
        groups: list[list[SourceFile]] = []
        size = 0
        for file in files:
            n = file.path.stat().st_size
            if not groups or len(groups[-1]) >= self.files_per_request or size + n > self.settings.max_upload_bytes:
                groups.append([])
                size = 0
            groups[-1].append(file)
            size += n
        return groups

    async def _upload(self, group: list[SourceFile], collection: str) -> list[FileResult]:
        handles = [f.path.open("rb") for f in group]
        try:
            parts = [("files", (f.name, h, "application/octet-stream")) for f, h in zip(group, handles)]
            data = {"collection": collection, "sources": [f.source for f in group]}
            response = await self._request("POST", "/v1/documents", files=parts, data=data)
        finally:
            for h in handles:
                h.close()
        if response.status_code == 200:
            by_order = response.json()["results"]
            return [
                FileResult(
                    f.name,
                    f.source,
                    r["document_id"],
                    r["status"],
                    r.get("reason"),
                    int(r.get("chunks") or 0),
                    warnings=tuple(r.get("warnings") or ()),
                )
                for f, r in zip(group, by_order)
            ]
        error = _error_of(response)
        if len(group) == 1 and response.status_code in (409, 413, 415, 422):
            return [FileResult(group[0].name, group[0].source, None, "failed", error.message, error=error)]
        if response.status_code == 413:  # the group as a whole is over the server's limit: one at a time
            return [r for f in group for r in await self._upload([f], collection)]
        raise error

    async def documents(self, collection: str) -> list[KnownDocument]:
        """Every name of the indexed and the failed documents."""
        found: list[KnownDocument] = []
        for state in ("indexed", "failed"):
            seen = 0
            while True:
                params: dict[str, Any] = {"collection": collection, "offset": seen, "limit": 1000, "state": state}
                page = (await self._checked("GET", "/v1/documents", params=params)).json()
                seen += len(page["documents"])
                found += [
                    KnownDocument(d["id"], n["source_key"], d["state"]) for d in page["documents"] for n in d["names"]
                ]
                if not page["documents"] or seen >= page["total"]:
                    break
        return found

    async def counts(self, collection: str) -> DocumentCounts:
        listed = (await self._checked("GET", "/v1/collections")).json()["collections"]
        found = next((c for c in listed if c["name"] == collection), None)
        return DocumentCounts(found["documents"], found["failed"]) if found else DocumentCounts()

    async def state_of(self, collection: str, doc_id: str) -> str | None:
        response = await self._request("GET", f"/v1/documents/{doc_id}", params={"collection": collection})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise _error_of(response)
        return str(response.json()["state"])

    async def delete(self, collection: str, doc_id: str, source: str | None = None) -> None:
        params = {"collection": collection} | ({"source": source} if source is not None else {})
        response = await self._request("DELETE", f"/v1/documents/{doc_id}", params=params)
        if response.status_code not in (204, 404):
            raise _error_of(response)

    async def _checked(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self._request(method, path, **kwargs)
        if response.status_code >= 400:
            raise _error_of(response)
        return response

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"the API at {self.url} is unreachable ({exc.__class__.__name__})") from exc


_ERRORS: dict[int, type[RagError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    503: BackendUnavailable,
}


def _error_of(response: httpx.Response) -> RagError:
    """The API's JSON error as one of our errors, carrying the API's code and status."""
    try:
        body = response.json()["error"]
        message, code = str(body["message"]), str(body.get("code", ""))
    except (ValueError, KeyError, TypeError):
        message, code = f"the API answered HTTP {response.status_code}", ""
    error = _ERRORS.get(response.status_code, UpstreamError)(message)
    error.status, error.code = response.status_code, code or error.code
    return error


@dataclass
class FoundApi:
    url: str
    data_dir: str | None  # as the API reports it in /health; None from an API that does not say


async def find_api(settings: Settings, transport: httpx.AsyncBaseTransport | None = None) -> FoundApi | None:
    """Our API at RAG_API_HOST:RAG_API_PORT if one answers there (healthy or not), with its data dir."""
    try:
        async with httpx.AsyncClient(timeout=2.0, transport=transport) as client:
            response = await client.get(f"{settings.api_url}/health")
        body = response.json()
    except (httpx.HTTPError, json.JSONDecodeError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("backends"), dict):
        return None
    store = body["backends"].get("store")
    data_dir = store.get("data_dir") if isinstance(store, dict) else None
    return FoundApi(settings.api_url, str(data_dir) if data_dir else None)


async def choose_api(settings: Settings, server: str | None, say: Callable[[str], None], *, who: str) -> str | None:
    """The API to work through (said with `say`, as `who`), or None to open the store here.

    An API found at RAG_API_HOST:RAG_API_PORT whose data dir is not the one the settings name is refused:
    the files would land (or answers come from) another store than the user means. `--server` uses it anyway.
    """
    if server:
        say(f"{who}: via the API at {server} (--server)")
        return server
    found = await find_api(settings) if settings.embedded_chroma else None
    if found is None:
        return None
    mine = settings.data_dir.expanduser().resolve()
    if found.data_dir is not None and Path(found.data_dir).expanduser().resolve() != mine:
        raise InvalidRequest(
            f"the API at {found.url} keeps its data in {found.data_dir}, but your settings name {mine} "
            f"(RAG_DATA_DIR): stop that API to use {mine}, or pass --server {found.url} to use that API's store"
        )
    say(f"{who}: via the API at {found.url} (data dir {found.data_dir or 'not reported'})")
    return found.url
