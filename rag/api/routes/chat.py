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
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.background import BackgroundTask

from rag.answering.answerer import Answer, ChatQuery
from rag.api.deps import AnswererDep, SettingsDep
from rag.api.errors import error_body
from rag.api.limits import check_messages
from rag.core.config import Settings
from rag.core.errors import RagError
from rag.store.catalog import check_collection

log = logging.getLogger(__name__)
router = APIRouter()

PING_S = 10
# A reader that stops reading (the socket's buffers full) is cut off after this long on one event, so a
# stalled client cannot hold a generation slot and its buffered tokens indefinitely.
SEND_TIMEOUT_S = 30.0
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


async def collect(answer: Answer) -> dict[str, Any]:
    """The whole answer as one document: the events' payloads under their names."""
    result: dict[str, Any] = {}
    parts: list[str] = []
    async for event in answer.events():
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


class _AnswerStream(EventSourceResponse):
    """The SSE response of one answer: a reader that stops reading is cut off after SEND_TIMEOUT_S, and
    the generation slot is given back and the generation stopped however the stream ends."""

    def __init__(self, answer: Answer, events: AsyncIterator[dict[str, str]]) -> None:
        super().__init__(events, ping=PING_S, send_timeout=SEND_TIMEOUT_S, background=BackgroundTask(answer.close))
        self.answer = answer
        self.events = events

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            log.info("a client stopped reading its stream for %g s: cut off", SEND_TIMEOUT_S)
        finally:
            self.answer.close()
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()


def event_stream(answer: Answer, events: AsyncIterator[dict[str, str]]) -> EventSourceResponse:
    """An SSE response that gives the generation slot back however the stream ends (even unstarted)."""
    return _AnswerStream(answer, events)


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
