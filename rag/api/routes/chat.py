"""`POST /v1/chat`: the native chat endpoint, streamed as SSE events or returned as one JSON document.

Events, in order: sources, budget, token (repeated), citations, done; on a failure after the stream
began, one `error` event ends it. `citations` holds the model's own valid [Sn] (`kind: "model"`) and the
sources attributed to the answer's sentences (`kind: "attributed"`, with `support`), the `invalid` and
`echoed` ids, and `sentences` with the sources of each and whether any supports it. Everything that can fail before generation (a bad request, the
question too long, a backend down, the queue full) is an HTTP error instead, with its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from rag.answering.answerer import Answer, ChatQuery, Event
from rag.api.deps import AnswererDep, SettingsDep
from rag.api.errors import error_body
from rag.api.limits import check_messages
from rag.store.catalog import check_collection
from rag.core.config import Settings
from rag.core.errors import RagError

log = logging.getLogger(__name__)
router = APIRouter()

PING_S = 10
DISCONNECT_POLL_S = 0.25
CLIENT_CLOSED = 499  # nginx's code for a client that closed the connection; nobody is left to read it

T = TypeVar("T")


class ChatMessage(BaseModel):
    role: Literal["user", "assistant"]
    content: str


class ChatRequest(BaseModel):
    messages: list[ChatMessage] = Field(min_length=1, fail_fast=True)  # a million wrong items stop at the first
    collection: str | None = None
    top_k: int | None = Field(default=None, ge=1, le=100)
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    stream: bool = True
    doc_ids: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)


def chat_query(messages: list[dict[str, str]], settings: Settings, *, collection: str | None, top_k: int | None,
               max_tokens: int | None, doc_ids: list[str] | None, temperature: float | None) -> ChatQuery:
    """A ChatQuery with the settings' defaults filled in (shared with the OpenAI-compatible route)."""
    check_messages(messages, settings)
    return ChatQuery(
        messages=messages,
        collection=check_collection(collection) if collection else settings.collection,
        top_k=top_k or settings.top_k,
        max_tokens=max_tokens,  # None: the prompt style's default (Answerer.with_defaults)
        doc_ids=doc_ids or None,
        temperature=temperature,
    )


async def collect(answer: Answer, on_event: Callable[[Event], Awaitable[None]] | None = None) -> dict[str, Any]:
    """The whole answer as one document: the events' payloads under their names. `on_event` sees each
    event as it comes (the MCP `ask` tool reports progress from it)."""
    result: dict[str, Any] = {}
    parts: list[str] = []
    async for event in answer.events():
        if on_event is not None:
            await on_event(event)
        if event.name == "token":
            parts.append(event.data["text"])
        elif event.name == "sources":
            result["sources"] = event.data["sources"]
            result["search"] = {k: v for k, v in event.data.items() if k != "sources"}  # the query searched
        elif event.name == "citations":
            result["citations"] = event.data
        else:
            result[event.name] = event.data
    return {"answer": "".join(parts), **result}


async def _sse(answer: Answer) -> AsyncIterator[dict[str, str]]:
    try:
        async for event in answer.events():
            yield {"event": event.name, "data": json.dumps(event.data, ensure_ascii=False)}
    except Exception as exc:  # the stream has begun: the failure becomes its last event
        if not isinstance(exc, RagError):
            log.exception("chat stream failed", exc_info=exc)
        yield {"event": "error", "data": json.dumps(error_body(exc)["error"], ensure_ascii=False)}


async def unless_disconnected(request: Request, answer: Answer, work: Awaitable[T]) -> T | Response:
    """Await a whole (non-streamed) answer, but stop generating if the client goes away meanwhile.

    A streamed answer learns of a disconnect from sse-starlette; a plain request is not cancelled by the
    server, so without this an SDK that timed out would keep the llama-server slot busy to max_tokens.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                log.info("client went away: generation stopped")
                return Response(status_code=CLIENT_CLOSED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        answer.close()


def event_stream(answer: Answer, events: AsyncIterator[dict[str, str]]) -> EventSourceResponse:
    """An SSE response that gives the generation slot back however the stream ends (even unstarted)."""
    return EventSourceResponse(events, ping=PING_S, background=BackgroundTask(answer.close))


@router.post("/chat")
async def chat(body: ChatRequest, request: Request, answerer: AnswererDep, settings: SettingsDep) -> Any:
    query = chat_query(
        [m.model_dump() for m in body.messages], settings, collection=body.collection, top_k=body.top_k,
        max_tokens=body.max_tokens, doc_ids=body.doc_ids, temperature=body.temperature,
    )
    answer = await answerer.start(query)
    if body.stream:
        return event_stream(answer, _sse(answer))
    return await unless_disconnected(request, answer, collect(answer))
