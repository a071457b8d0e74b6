"""`POST /v1/completions`: OpenAI's legacy text completions, for clients that post there by default
(LlamaIndex's `OpenAILike`, older LangChain `OpenAI`).

The prompt is the user's question, answered from the documents as `/v1/chat/completions` answers a
one-message chat (the same options: `collection`, `top_k`, `doc_ids`, or the model `rag:NAME`); the reply
is a `text_completion` (streamed as its chunks, then `[DONE]`), with `rag` beside it as on the chat route.
One prompt per request: a list of several is a 400 (each would be a separate RAG question).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse

from rag.answering.answerer import Answer, NoSourcesAnswer
from rag.answering.events import Collected
from rag.api.asking import chat_query
from rag.api.deps import AccessDep, AnswererDep, SettingsDep
from rag.api.routes.chat import event_stream, streamed, whole
from rag.api.routes.models import check_chat_model
from rag.api.routes.openai_compat import (
    Rag,
    StreamOptions,
    Usage,
    UsageMode,
    absorbed,
    chosen_collection,
    finish_reason,
    rag_part,
    stream_error,
    usage_mode,
    usage_of,
)
from rag.core.errors import InvalidRequest

router = APIRouter()


class TextCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[str]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    temperature: float | None = Field(default=None, ge=0, le=2)
    collection: str | None = None
    top_k: int | None = Field(default=None, ge=1, le=100)
    doc_ids: list[str] | None = None

    def question(self) -> str:
        if isinstance(self.prompt, list) and len(self.prompt) > 1:
            raise InvalidRequest(f"`prompt` holds {len(self.prompt):,} prompts; send one question per request")
        text = self.prompt if isinstance(self.prompt, str) else (self.prompt[0] if self.prompt else "")
        if not text.strip():
            raise InvalidRequest("`prompt` is empty: send the question as the prompt")
        return text


class TextChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    rag: Rag | None = None


class _Text:
    """The text_completion objects of one answer."""

    def __init__(self, model: str, mode: UsageMode) -> None:
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.mode = mode
        self.answer = Collected()

    def piece(self, text: str, finish: Literal["stop", "length"] | None = None) -> TextCompletion:
        choice = TextChoice(text=text, finish_reason=finish)
        return TextCompletion(id=self.id, created=self.created, model=self.model, choices=[choice])

    def last(self) -> TextCompletion:
        last = self.piece("", finish_reason(self.answer))
        last.rag = rag_part(self.answer, 0)
        if self.mode != "none":
            last.usage = usage_of(self.answer)
        return last

    def whole(self) -> TextCompletion:
        done = self.piece(self.answer.text, finish_reason(self.answer))
        done.rag, done.usage = rag_part(self.answer, 0), usage_of(self.answer)
        return done


def _dumped(completion: TextCompletion) -> str:
    return json.dumps(completion.model_dump(mode="json", exclude_none=False), ensure_ascii=False)


async def _chunks(answer: Answer | NoSourcesAnswer, text: _Text) -> AsyncIterator[dict[str, str]]:
    try:
        async for event in answer.events():
            piece = text.answer.absorb(event)
            if piece:
                yield {"data": _dumped(text.piece(piece))}
        yield {"data": _dumped(text.last())}
        yield {"data": "[DONE]"}
    except Exception as exc:
        yield stream_error(exc)


STREAMED = streamed(
    "With `stream`: `text_completion` chunks as server-sent events, the last with `rag` "
    "(and `usage`), then `[DONE]`. Without: one `text_completion`."
)


@router.post("/completions", response_model=TextCompletion, responses=STREAMED)
async def text_completions(
    body: TextCompletionRequest, request: Request, answerer: AnswererDep, settings: SettingsDep, access: AccessDep
) -> TextCompletion | EventSourceResponse:
    model = check_chat_model(settings, body.model)
    query = chat_query(
        [{"role": "user", "content": body.question()}],
        settings,
        access,
        collection=chosen_collection(model, body.collection),
        top_k=body.top_k,
        max_tokens=body.max_tokens,
        doc_ids=body.doc_ids,
        temperature=body.temperature,
    )
    answer = await answerer.start(query)
    text = _Text(model.name, usage_mode(body.stream, body.stream_options))
    if body.stream:
        return event_stream(answer, _chunks(answer, text))
    return await whole(request, answer, absorbed(answer, text.answer, text.whole))
