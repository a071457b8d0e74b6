"""`POST /v1/chat`: the native chat endpoint, streamed as SSE events or returned as one JSON document.

Events, in order: sources, budget, token (repeated), citations, done; on a failure after the stream
began, one `error` event ends it. Everything that can fail before generation (a bad request, the
question too long, a backend down, the queue full) is an HTTP error instead, with its status.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from rag.answering import Answer, ChatQuery
from rag.api.deps import AnswererDep, SettingsDep
from rag.api.errors import error_body
from rag.config import Settings
from rag.errors import RagError

log = logging.getLogger(__name__)
router = APIRouter()

PING_S = 10


class ChatMessage(BaseModel):
    role: Literal["user", "assistant"]
    content: str


class ChatRequest(BaseModel):
    messages: list[ChatMessage] = Field(min_length=1)
    collection: str | None = None
    top_k: int | None = Field(default=None, ge=1, le=100)
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    stream: bool = True
    doc_ids: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)


def chat_query(messages: list[dict[str, str]], settings: Settings, *, collection: str | None, top_k: int | None,
               max_tokens: int | None, doc_ids: list[str] | None, temperature: float | None) -> ChatQuery:
    """A ChatQuery with the settings' defaults filled in (shared with the OpenAI-compatible route)."""
    return ChatQuery(
        messages=messages,
        collection=collection or settings.collection,
        top_k=top_k or settings.top_k,
        max_tokens=max_tokens or settings.answer_reserve,
        doc_ids=doc_ids or None,
        temperature=0.2 if temperature is None else temperature,
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


def event_stream(answer: Answer, events: AsyncIterator[dict[str, str]]) -> EventSourceResponse:
    """An SSE response that gives the generation slot back however the stream ends (even unstarted)."""
    return EventSourceResponse(events, ping=PING_S, background=BackgroundTask(answer.close))


@router.post("/chat")
async def chat(request: ChatRequest, answerer: AnswererDep, settings: SettingsDep) -> Any:
    query = chat_query(
        [m.model_dump() for m in request.messages], settings, collection=request.collection, top_k=request.top_k,
        max_tokens=request.max_tokens, doc_ids=request.doc_ids, temperature=request.temperature,
    )
    answer = await answerer.start(query)
    if request.stream:
        return event_stream(answer, _sse(answer))
    try:
        return await collect(answer)
    finally:
        answer.close()
