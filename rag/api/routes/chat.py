"""`POST /v1/chat`: the native chat endpoint, streamed as SSE events or returned as one JSON document.

Events, in order: sources, budget, token (repeated), citations, done; on a failure after the stream
began, one `error` event ends it. `citations` holds the model's own valid [Sn] (`kind: "model"`) and the
sources attributed to the answer's sentences (`kind: "attributed"`, with `support`), the `invalid` and
`echoed` ids, and `sentences` with the sources of each and whether any supports it. Everything that can fail before generation (a bad request, the
question too long, a backend down, the queue full) is an HTTP error instead, with its status.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.background import BackgroundTask

from rag.answering.answerer import Answer, NoSourcesAnswer
from rag.answering.events import AnswerDocument
from rag.api.asking import chat_query
from rag.api.deps import AccessDep, AnswererDep, SettingsDep
from rag.api.errors import error_body
from rag.core.disconnect import unless_disconnected
from rag.core.errors import RagError

log = logging.getLogger(__name__)
router = APIRouter()

PING_S = 10
# A reader that stops reading (the socket's buffers full) is cut off after this long on one event, so a
# stalled client cannot hold a generation slot and its buffered tokens indefinitely.
SEND_TIMEOUT_S = 30.0
DISCONNECT_POLL_S = 0.25

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


async def _sse(answer: Answer | NoSourcesAnswer) -> AsyncIterator[dict[str, str]]:
    try:
        async for event in answer.events():
            yield {"event": event.name, "data": event.model_dump_json()}
    except Exception as exc:  # the stream has begun: the failure becomes its last event
        if not isinstance(exc, RagError):
            log.exception("chat stream failed", exc_info=exc)
        yield {"event": "error", "data": json.dumps(error_body(exc)["error"], ensure_ascii=False)}


async def whole(request: Request, answer: Answer | NoSourcesAnswer, work: Awaitable[T]) -> T:
    """Await a whole (non-streamed) answer, but stop generating if the client goes away meanwhile (a
    streamed answer learns of that from sse-starlette); the generation slot is given back either way."""
    try:
        return await unless_disconnected(work, request.is_disconnected, poll_s=DISCONNECT_POLL_S)
    finally:
        answer.close()


class _AnswerStream(EventSourceResponse):
    """The SSE response of one answer: a reader that stops reading is cut off after SEND_TIMEOUT_S, and
    the generation slot is given back and the generation stopped however the stream ends."""

    def __init__(self, answer: Answer | NoSourcesAnswer, events: AsyncIterator[dict[str, str]]) -> None:
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


def event_stream(answer: Answer | NoSourcesAnswer, events: AsyncIterator[dict[str, str]]) -> EventSourceResponse:
    """An SSE response that gives the generation slot back however the stream ends (even unstarted)."""
    return _AnswerStream(answer, events)


def streamed(description: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that answers server-sent events or one JSON document (its
    `response_model`); `description` says which when."""
    return {200: {"description": description, "content": {"text/event-stream": {"schema": {"type": "string"}}}}}


STREAMED = streamed(
    "With `stream` (the default): server-sent events `sources` (the document's `sources` "
    'with its `search` fields beside them), `budget`, `token` (`{"text": ...}`)..., `citations` and `done` '
    '(as the document\'s fields of those names), or `error`. With `"stream": false`: the whole answer as one '
    "JSON document."
)


@router.post("/chat", response_model=AnswerDocument, responses=STREAMED)
async def chat(
    body: ChatRequest, request: Request, answerer: AnswererDep, settings: SettingsDep, access: AccessDep
) -> AnswerDocument | EventSourceResponse:
    query = chat_query(
        [{"role": m.role, "content": m.content} for m in body.messages],
        settings,
        access,
        collection=body.collection,
        top_k=body.top_k,
        max_tokens=body.max_tokens,
        doc_ids=body.doc_ids,
        temperature=body.temperature,
    )
    answer = await answerer.start(query)
    if body.stream:
        return event_stream(answer, _sse(answer))
    return await whole(request, answer, AnswerDocument.collect(answer.events()))
