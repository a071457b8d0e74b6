"""`POST /v1/chat/completions`: the answering core behind the OpenAI chat API, for the official SDKs.

Retrieval options travel as extra body fields (`collection`, `top_k`, `doc_ids`: the SDK's
`extra_body`), or the collection as the model (`rag:NAME`, for clients that cannot send extra fields).
The sources the answer cites come as OpenAI's `url_citation` annotations (`message.annotations`, or
`delta.annotations` of the final chunk), each a link that opens the cited chunk in our page's viewer
(rag/api/citation_links.py); the sources, the budget, the checked citations and our timings ride in an
extra field `rag` beside them. A client's system messages (its user's "Answer in French") follow our fixed
system prompt in the chat prompt style, within RAG_CLIENT_SYSTEM_TOKENS (`rag.budget.client_system`); the
completion style (a base model) leaves them out, counted in `rag.ignored_system_messages` and noted among
the annotations.

`model` must be the served generator's name, `rag:NAME`, or left out; another name is a 404 in OpenAI's
shape. Usage: with `stream_options.include_usage` the stream follows OpenAI (every chunk carries
`usage: null` and one more chunk with no choices and the usage comes before `[DONE]`); when the client
does not say, the final chunk carries it (clients that read usage from any chunk show it unasked);
`include_usage: false` leaves it out. A chat client's own background tasks (a title, tags, follow-ups:
rag/api/client_tasks.py) are answered at once without retrieval or the generation slot.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, NotRequired, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse
from typing_extensions import TypedDict

from rag.answering.answerer import Answer, NoSourcesAnswer
from rag.answering.events import Budget, Citations, Collected, Done, NoSourcesDone, SourceEntry
from rag.answering.prompt import Message
from rag.api.asking import chat_query
from rag.api.citation_links import Annotation, SystemMessage, url_citations
from rag.api.client_tasks import ClientTask, client_task
from rag.api.deps import AccessDep, AnswererDep, SettingsDep
from rag.api.errors import error_body
from rag.api.routes.chat import event_stream, streamed, whole
from rag.api.routes.models import ChatModel, check_chat_model
from rag.core.errors import InvalidRequest, RagError

log = logging.getLogger(__name__)
router = APIRouter()
T = TypeVar("T")


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None  # content parts: OpenAI's, free-form beyond `type`/`text`


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


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
    annotations: list[Annotation] = Field(default_factory=list)


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]


class TaskRag(BaseModel):
    """Our part of a client task's completion: which task it was (nothing was retrieved or generated)."""

    task: str


class ChatCompletion(BaseModel):
    """A whole completion in OpenAI's shape, with `rag` beside it."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    rag: Rag | TaskRag


class Delta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str
    annotations: list[dict[str, Any]]


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


def chat_messages(messages: list[OpenAIMessage]) -> tuple[list[Message], list[str]]:
    """User and assistant messages as our chat; the texts of the system/developer messages apart (empty
    ones dropped)."""
    kept: list[Message] = []
    system: list[str] = []
    for message in messages:
        if message.role in ("system", "developer"):
            if text := _text(message.content).strip():
                system.append(text)
        elif message.role in ("user", "assistant"):
            kept.append({"role": message.role, "content": _text(message.content)})
        else:
            raise InvalidRequest(f"message role {message.role!r} is not supported (user, assistant, system)")
    return kept, system


def system_message(answer: Collected, sent: int) -> SystemMessage:
    """What became of the client's `sent` system messages, from the budget of the prompt built."""
    budget = answer.budget
    if not sent or budget is None:
        return "none"
    if budget.client_system:
        return "cut" if budget.client_system_cut else "passed"
    if budget.n_ctx is None:  # no prompt was built (nothing found): nothing generated, nothing to note
        return "none"
    return "base_model" if budget.style == "completion" else "too_long"


UsageMode = Literal["openai", "final", "none"]  # include_usage true / not said / false


def rag_part(answer: Collected, system_messages: int) -> Rag:
    """`rag` of an ended answer; `system_messages` the client sent (those not passed on count as ignored)."""
    document = answer.document()
    passed = system_message(answer, system_messages) in ("passed", "cut")
    return Rag(
        ignored_system_messages=0 if passed else system_messages,
        sources=document.sources,
        budget=document.budget,
        citations=document.citations,
        done=document.done,
    )


def finish_reason(answer: Collected) -> Literal["stop", "length"]:
    """OpenAI's finish reason: `length` at the token limit, `stop` for every other end."""
    return "length" if answer.done is not None and answer.done.finish_reason == "length" else "stop"


def usage_of(answer: Collected) -> Usage:
    usage = answer.done.usage if answer.done else {}
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class _Completion:
    """Builds the OpenAI-shaped objects of one completion from the answer's events."""

    def __init__(
        self,
        model: str,
        system_messages: int,
        *,
        usage_mode: UsageMode = "final",
        base_url: str = "",
        collection: str | None = None,
    ) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.include_usage = usage_mode == "openai"
        self.usage_mode = usage_mode
        self.created = int(time.time())
        self.model = model
        self.system_messages = system_messages
        self.base_url = base_url
        self.collection = collection
        self.answer = Collected()

    def annotations(self) -> list[Annotation]:
        sources = self.answer.sources.sources if self.answer.sources else []
        return url_citations(
            self.answer.text,
            sources,
            self.answer.citations,
            base_url=self.base_url,
            collection=self.collection,
            cut=self.finish_reason == "length",
            system=system_message(self.answer, self.system_messages),
        )

    def rag(self) -> Rag:
        return rag_part(self.answer, self.system_messages)

    @property
    def finish_reason(self) -> Literal["stop", "length"]:
        return finish_reason(self.answer)

    @property
    def usage(self) -> Usage:
        return usage_of(self.answer)

    def chunk(self, delta: Delta) -> str:
        return json.dumps(self._chunk([{"index": 0, "delta": delta, "finish_reason": None}]), ensure_ascii=False)

    def final_chunk(self) -> str:
        """The chunk with the finish reason: the annotations, `rag`, and the usage unless told otherwise."""
        delta: Delta = {"annotations": [a.model_dump() for a in self.annotations()]}
        body = self._chunk([{"index": 0, "delta": delta, "finish_reason": self.finish_reason}])
        body["rag"] = self.rag().model_dump(mode="json")
        if self.usage_mode == "final":
            body["usage"] = self.usage.model_dump()
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
        message = AssistantMessage(content=self.answer.text, annotations=self.annotations())
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
        yield {"data": completion.final_chunk()}
        if completion.include_usage:
            yield {"data": completion.usage_chunk()}
        yield {"data": "[DONE]"}
    except Exception as exc:
        yield stream_error(exc)


def stream_error(exc: Exception) -> dict[str, str]:
    """The last event of a stream that failed once begun: an error object is what OpenAI clients understand."""
    if not isinstance(exc, RagError):
        log.exception("completion stream failed", exc_info=exc)
    return {"data": json.dumps(error_body(exc), ensure_ascii=False)}


async def absorbed(answer: Answer | NoSourcesAnswer, collected: Collected, response: Callable[[], T]) -> T:
    """Read a whole (non-streamed) answer into `collected`; then the `response` made of it."""
    async for event in answer.events():
        collected.absorb(event)
    return response()


STREAMED = streamed(
    "With `stream`: OpenAI's `chat.completion.chunk` server-sent events, the last chunk with "
    "choices carrying `rag`, then `[DONE]`. Without: one `chat.completion`."
)


def usage_mode(stream: bool, options: StreamOptions | None) -> UsageMode:
    """OpenAI's usage chunk when asked for; none when refused; else on the final chunk (or the response)."""
    said = options.include_usage if options is not None else None
    if stream and said:
        return "openai"
    return "none" if said is False else "final"


def chosen_collection(model: ChatModel, collection: str | None) -> str | None:
    """The collection of `rag:NAME` or of the `collection` field; both, naming two, is a 400."""
    if model.collection and collection and model.collection != collection:
        raise InvalidRequest(
            f"the model {model.name!r} searches the collection {model.collection!r}, but `collection` says "
            f"{collection[:100]!r}: name one"
        )
    return model.collection or collection


def _task_completion(task: ClientTask, model: str) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[Choice(message=AssistantMessage(content=task.content), finish_reason="stop")],
        usage=Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0),
        rag=TaskRag(task=task.kind),
    )


async def _task_chunks(completion: ChatCompletion) -> AsyncIterator[dict[str, str]]:
    base = {"id": completion.id, "object": "chat.completion.chunk", "created": completion.created}
    deltas: list[tuple[dict[str, Any], str | None]] = [
        ({"role": "assistant", "content": ""}, None),
        ({"content": completion.choices[0].message.content}, None),
        ({}, "stop"),
    ]
    for delta, finish in deltas:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body: dict[str, Any] = {**base, "model": completion.model, "choices": [choice]}
        if finish:
            body["rag"] = completion.rag.model_dump()
        yield {"data": json.dumps(body, ensure_ascii=False)}
    yield {"data": "[DONE]"}


@router.post("/chat/completions", response_model=ChatCompletion, responses=STREAMED)
async def chat_completions(
    body: CompletionRequest, request: Request, answerer: AnswererDep, settings: SettingsDep, access: AccessDep
) -> ChatCompletion | EventSourceResponse:
    model = check_chat_model(settings, body.model)
    messages, system = chat_messages(body.messages)
    collection = chosen_collection(model, body.collection)
    task = client_task(messages[-1]["content"]) if messages and messages[-1]["role"] == "user" else None
    if task is not None:
        access.collection(collection, settings)  # a task is answered only for a collection the key opens
        done = _task_completion(task, model.name)
        return EventSourceResponse(_task_chunks(done)) if body.stream else done
    query = chat_query(
        messages,
        settings,
        access,
        collection=collection,
        top_k=body.top_k,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        doc_ids=body.doc_ids,
        temperature=body.temperature,
        system="\n\n".join(system),
    )
    answer = await answerer.start(query)
    completion = _Completion(
        model.name,
        len(system),
        usage_mode=usage_mode(body.stream, body.stream_options),
        base_url=str(request.base_url),
        collection=query.collection,
    )
    if body.stream:
        return event_stream(answer, _chunks(answer, completion))
    return await whole(request, answer, absorbed(answer, completion.answer, completion.response))
