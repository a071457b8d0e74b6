"""`POST /v1/chat/completions`: the answering core behind the OpenAI chat API, for the official SDKs.

Retrieval options travel as extra body fields (`collection`, `top_k`, `doc_ids`: the SDK's
`extra_body`). The sources, the budget, the checked citations and our timings ride in an extra field
`rag` of the response, or of the final chunk of a stream. Our system prompt is fixed (it grounds the
answer and keeps the prompt cache warm): a client's system messages are left out and counted in
`rag.ignored_system_messages`.

`model` must be the served generator's name (or left out); another name is a 404 in OpenAI's shape. With
`stream_options.include_usage` the stream follows OpenAI: every chunk carries `usage: null` and one more
chunk with no choices and the usage comes before `[DONE]`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal, NotRequired

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse
from typing_extensions import TypedDict

from rag.answering.answerer import Answer, NoSourcesAnswer
from rag.answering.events import Budget, Citations, Collected, Done, NoSourcesDone, SourceEntry
from rag.answering.prompt import Message
from rag.api.asking import chat_query
from rag.api.deps import AccessDep, AnswererDep, SettingsDep
from rag.api.errors import error_body
from rag.api.routes.chat import event_stream, whole
from rag.api.routes.models import check_chat_model
from rag.core.errors import InvalidRequest, RagError

log = logging.getLogger(__name__)
router = APIRouter()


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None  # content parts: OpenAI's, free-form beyond `type`/`text`


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[OpenAIMessage] = Field(min_length=1, fail_fast=True)  # a million wrong items stop at the first
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768)
    temperature: float | None = Field(default=None, ge=0, le=2)
    collection: str | None = None
    top_k: int | None = Field(default=None, ge=1, le=100)
    doc_ids: list[str] | None = None


class Rag(BaseModel):
    """Our part of a completion: the sources, the budget, the checked citations and our timings."""

    ignored_system_messages: int
    sources: list[SourceEntry]
    budget: Budget
    citations: Citations
    done: Done | NoSourcesDone


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]


class ChatCompletion(BaseModel):
    """A whole completion in OpenAI's shape, with `rag` beside it."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    rag: Rag


class Delta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str


class ChunkChoice(TypedDict):
    index: int
    delta: Delta
    finish_reason: Literal["stop", "length"] | None


class CompletionChunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: NotRequired[dict[str, int] | None]
    rag: NotRequired[dict[str, Any]]


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = [p.get("text", "") for p in content if p.get("type") == "text"]
    if len(parts) != len(content):
        raise InvalidRequest("only text content parts are supported")
    return "".join(parts)


def chat_messages(messages: list[OpenAIMessage]) -> tuple[list[Message], int]:
    """User and assistant messages as our chat; the count of system/developer messages left out."""
    kept, ignored = [], 0
    for message in messages:
        if message.role in ("system", "developer"):
            ignored += 1
        elif message.role in ("user", "assistant"):
            kept.append({"role": message.role, "content": _text(message.content)})
        else:
            raise InvalidRequest(f"message role {message.role!r} is not supported (user, assistant, system)")
    return kept, ignored


class _Completion:
    """Builds the OpenAI-shaped objects of one completion from the answer's events."""

    def __init__(self, model: str, ignored_system: int, *, include_usage: bool = False) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.include_usage = include_usage
        self.created = int(time.time())
        self.model = model
        self.ignored_system = ignored_system
        self.answer = Collected()

    def rag(self) -> Rag:
        document = self.answer.document()
        return Rag(
            ignored_system_messages=self.ignored_system,
            sources=document.sources,
            budget=document.budget,
            citations=document.citations,
            done=document.done,
        )

    @property
    def finish_reason(self) -> Literal["stop", "length"]:
        reason = self.answer.done.finish_reason if self.answer.done else None
        return "length" if reason == "length" else "stop"

    @property
    def usage(self) -> Usage:
        usage = self.answer.done.usage if self.answer.done else {}
        prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def chunk(
        self, delta: Delta, finish_reason: Literal["stop", "length"] | None = None, *, rag: Rag | None = None
    ) -> str:
        body = self._chunk([{"index": 0, "delta": delta, "finish_reason": finish_reason}])
        if rag is not None:
            body["rag"] = rag.model_dump(mode="json")
        return json.dumps(body, ensure_ascii=False)

    def usage_chunk(self) -> str:
        """OpenAI's last chunk with `include_usage`: no choices, the whole request's usage."""
        body = self._chunk([])
        body["usage"] = self.usage.model_dump()
        return json.dumps(body, ensure_ascii=False)

    def _chunk(self, choices: list[ChunkChoice]) -> CompletionChunk:
        body: CompletionChunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None
        return body

    def response(self) -> ChatCompletion:
        message = AssistantMessage(content=self.answer.text)
        return ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            usage=self.usage,
            rag=self.rag(),
            choices=[Choice(message=message, finish_reason=self.finish_reason)],
        )


async def _chunks(answer: Answer | NoSourcesAnswer, completion: _Completion) -> AsyncIterator[dict[str, str]]:
    try:
        yield {"data": completion.chunk({"role": "assistant", "content": ""})}
        async for event in answer.events():
            text = completion.answer.absorb(event)
            if text:
                yield {"data": completion.chunk({"content": text})}
        yield {"data": completion.chunk({}, completion.finish_reason, rag=completion.rag())}
        if completion.include_usage:
            yield {"data": completion.usage_chunk()}
        yield {"data": "[DONE]"}
    except Exception as exc:  # the stream has begun: an error object is what OpenAI clients understand
        if not isinstance(exc, RagError):
            log.exception("chat completion stream failed", exc_info=exc)
        yield {"data": json.dumps(error_body(exc), ensure_ascii=False)}


async def _whole(answer: Answer | NoSourcesAnswer, completion: _Completion) -> ChatCompletion:
    async for event in answer.events():
        completion.answer.absorb(event)
    return completion.response()


STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "With `stream`: OpenAI's `chat.completion.chunk` server-sent events, the last chunk with "
        "choices carrying `rag`, then `[DONE]`. Without: one `chat.completion`.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@router.post("/chat/completions", response_model=ChatCompletion, responses=STREAMED)
async def chat_completions(
    body: CompletionRequest, request: Request, answerer: AnswererDep, settings: SettingsDep, access: AccessDep
) -> ChatCompletion | EventSourceResponse:
    model = check_chat_model(settings, body.model)
    messages, ignored = chat_messages(body.messages)
    query = chat_query(
        messages,
        settings,
        access,
        collection=body.collection,
        top_k=body.top_k,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        doc_ids=body.doc_ids,
        temperature=body.temperature,
    )
    answer = await answerer.start(query)
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    completion = _Completion(model, ignored, include_usage=include_usage)
    if body.stream:
        return event_stream(answer, _chunks(answer, completion))
    return await whole(request, answer, _whole(answer, completion))
