"""What the MCP tools do, over this process's services: the same retriever, answering core and catalog
as the HTTP routes (nothing here re-implements retrieval, grounding or the "not in the documents" rule)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from rag.answering.events import AnswerDocument, Done, Event, NoSourcesDone
from rag.api.access import Access
from rag.api.asking import chat_query, collect
from rag.api.mcp.payloads import (
    AskResult,
    CollectionEntry,
    CollectionList,
    DocumentEntry,
    DocumentList,
    SearchHit,
    SearchResult,
    document_uri,
)
from rag.api.services import Services
from rag.core.embeddings_api import check_text
from rag.core.errors import NotFound
from rag.store.document_text import stitched

# Called with (tokens generated so far, the text just generated) while an answer is written.
Progress = Callable[[float, str | None], Awaitable[None]]


class Library(Protocol):
    """The tools' work; `access` is the caller's (rag/api/access.py): the collections it opens."""

    async def search(self, query: str, collection: str | None, top_k: int | None, access: Access) -> SearchResult: ...
    async def ask(
        self,
        question: str,
        collection: str | None,
        history: list[dict[str, str]],
        top_k: int | None,
        progress: Progress,
        access: Access,
    ) -> AskResult: ...
    async def documents(self, collection: str | None, offset: int, limit: int, access: Access) -> DocumentList: ...
    async def collections(self, access: Access) -> CollectionList: ...
    async def document_text(self, collection: str, doc_id: str, access: Access) -> str: ...


class LocalLibrary:
    """The tools over a `Services` (the API's own, or one `rag mcp` opened); `services` is read per call,
    since the API builds its services only at start-up."""

    def __init__(self, services: Callable[[], Services]) -> None:
        self._services = services

    async def search(self, query: str, collection: str | None, top_k: int | None, access: Access) -> SearchResult:
        services = self._services()
        check_text("query", query, services.settings.max_message_chars)
        name = access.collection(collection, services.settings)
        hits = await services.answerer().searcher.search(query, collection=name, k=top_k or services.settings.top_k)
        results = [
            SearchHit(
                chunk_id=h.chunk_id,
                doc_id=h.doc_id,
                document=str(h.metadata.get("source", "")),
                page=h.metadata.get("page"),
                heading=h.metadata.get("heading"),
                score=round(float(h.score), 4),
                text=h.text,
            )
            for h in hits
        ]
        return SearchResult(query=query, collection=name, results=results)

    async def ask(
        self,
        question: str,
        collection: str | None,
        history: list[dict[str, str]],
        top_k: int | None,
        progress: Progress,
        access: Access,
    ) -> AskResult:
        services = self._services()
        query = chat_query(
            [*history, {"role": "user", "content": question}],
            services.settings,
            access,
            collection=collection,
            top_k=top_k,
            max_tokens=None,
            doc_ids=None,
            temperature=None,
        )
        answer = await services.answerer().start(query)
        tokens = 0

        async def on_event(event: Event) -> None:
            nonlocal tokens
            if event.name == "token":
                tokens += 1
                await progress(tokens, event.data["text"])

        try:
            document = await collect(answer, on_event)
        finally:
            answer.close()
        return ask_result(document, query.collection)

    async def documents(self, collection: str | None, offset: int, limit: int, access: Access) -> DocumentList:
        services = self._services()
        catalog = services.catalog
        name = access.collection(collection, services.settings)
        records, total = await asyncio.to_thread(
            lambda: (catalog.documents(name, offset, limit), catalog.count_in(name))
        )
        if not total:
            known = await asyncio.to_thread(catalog.collections)
            access.check_exists(name, services.settings, (n for n, _ in known))
        entries = [
            DocumentEntry(
                id=r.doc_id,
                name=r.name,
                collection=name,
                state=r.state,
                chunks=r.chunks,
                pages=r.pages,
                uri=document_uri(name, r.doc_id),
            )
            for r in records
        ]
        return DocumentList(collection=name, total=total, documents=entries)

    async def collections(self, access: Access) -> CollectionList:
        rows = await asyncio.to_thread(self._services().catalog.collections)
        entries = [CollectionEntry(name=n, documents=count) for n, count in rows if access.allows(n)]
        return CollectionList(collections=entries)

    async def document_text(self, collection: str, doc_id: str, access: Access) -> str:
        services = self._services()
        name = access.collection(collection, services.settings)
        record = await asyncio.to_thread(services.catalog.get, name, doc_id)
        if record is None or record.state != "indexed":
            raise NotFound(f"no indexed document {doc_id} in collection {name}")
        return stitched(await asyncio.to_thread(services.lexical.document_chunks, name, doc_id))


def ask_result(document: AnswerDocument, collection: str) -> AskResult:
    """The tool's answer from /v1/chat's whole-answer document (rag.api.asking.collect)."""
    done = document.done
    return AskResult(
        answer=document.answer,
        collection=collection,
        query=document.search.query,
        rewrite=document.search.rewrite,
        sources=document.sources,
        citations=document.citations.citations,
        unsupported_sentences=done.unsupported_sentences if isinstance(done, Done) else 0,
        no_sources=done.no_sources if isinstance(done, NoSourcesDone) else None,
    )
