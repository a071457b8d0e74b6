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
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from rag.answering.answerer import Answer, Event
from rag.api.deps import AnswererDep, SettingsDep
from rag.api.errors import error_body
from rag.api.routes.chat import chat_query, event_stream, unless_disconnected
from rag.api.routes.models import check_chat_model
from rag.core.errors import InvalidRequest, RagError

log = logging.getLogger(__name__)
router = APIRouter()


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


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


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = [p.get("text", "") for p in content if p.get("type") == "text"]
    if len(parts) != len(content):
        raise InvalidRequest("only text content parts are supported")
    return "".join(parts)


def chat_messages(messages: list[OpenAIMessage]) -> tuple[list[dict[str, str]], int]:
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
    """Builds the OpenAI-shaped objects of one completion."""

    def __init__(self, model: str, ignored_system: int, *, include_usage: bool = False) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.include_usage = include_usage
        self.created = int(time.time())
        self.model = model
        self.rag: dict[str, Any] = {"ignored_system_messages": ignored_system}
        self.text: list[str] = []

    def absorb(self, event: Event) -> str | None:
        """Keep an event's payload; return its text when it is a token."""
        if event.name == "token":
            self.text.append(event.data["text"])
            return event.data["text"]
        self.rag[event.name] = event.data["sources"] if event.name == "sources" else event.data
        return None

    @property
    def finish_reason(self) -> str:
        reason = self.rag.get("done", {}).get("finish_reason")
        return reason if reason in ("stop", "length") else "stop"

    @property
    def usage(self) -> dict[str, int]:
        usage = self.rag.get("done", {}).get("usage") or {}
        prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
        return self._chunk([{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra)

    def usage_chunk(self) -> str:
        """OpenAI's last chunk with `include_usage`: no choices, the whole request's usage."""
        return self._chunk([], usage=self.usage)

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices}
        if self.include_usage:
            body["usage"] = None
        return json.dumps({**body, **extra}, ensure_ascii=False)

    def response(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(self.text)},
                         "finish_reason": self.finish_reason}],
            "usage": self.usage,
            "rag": self.rag,
        }


async def _chunks(answer: Answer, completion: _Completion) -> AsyncIterator[dict[str, str]]:
    try:
        yield {"data": completion.chunk({"role": "assistant", "content": ""})}
        async for event in answer.events():
            text = completion.absorb(event)
            if text:
                yield {"data": completion.chunk({"content": text})}
        yield {"data": completion.chunk({}, completion.finish_reason, rag=completion.rag)}
        if completion.include_usage:
            yield {"data": completion.usage_chunk()}
        yield {"data": "[DONE]"}
    except Exception as exc:  # the stream has begun: an error object is what OpenAI clients understand
        if not isinstance(exc, RagError):
            log.exception("chat completion stream failed", exc_info=exc)
        yield {"data": json.dumps(error_body(exc), ensure_ascii=False)}


async def _whole(answer: Answer, completion: _Completion) -> dict[str, Any]:
    async for event in answer.events():
        completion.absorb(event)
    return completion.response()


@router.post("/chat/completions")
async def chat_completions(body: CompletionRequest, request: Request, answerer: AnswererDep,
                           settings: SettingsDep) -> Any:
    model = check_chat_model(settings, body.model)
    messages, ignored = chat_messages(body.messages)
    query = chat_query(
        messages, settings, collection=body.collection, top_k=body.top_k,
        max_tokens=body.max_completion_tokens or body.max_tokens, doc_ids=body.doc_ids,
        temperature=body.temperature,
    )
    answer = await answerer.start(query)
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    completion = _Completion(model, ignored, include_usage=include_usage)
    if body.stream:
        return event_stream(answer, _chunks(answer, completion))
    return await unless_disconnected(request, answer, _whole(answer, completion))
