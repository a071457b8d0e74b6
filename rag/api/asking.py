"""What the chat route, the OpenAI-compatible route and the MCP tools share about a question: the
`ChatQuery` made from it (the settings' defaults, the collection the caller may open) and its answer
collected whole."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from rag.answering.answerer import Answer, ChatQuery, NoSourcesAnswer
from rag.answering.events import AnswerDocument, Event
from rag.answering.prompt import Message
from rag.api.access import Access
from rag.api.limits import check_messages
from rag.core.config import Settings
from rag.core.embeddings_api import check_text


def chat_query(
    messages: list[Message],
    settings: Settings,
    access: Access,
    *,
    collection: str | None,
    top_k: int | None,
    max_tokens: int | None,
    doc_ids: list[str] | None,
    temperature: float | None,
    system: str | None = None,
) -> ChatQuery:
    """A ChatQuery with the settings' defaults filled in, in a collection `access` opens (shared with the
    OpenAI-compatible route and the MCP tools); `system` is a client's system message, bounded as a message."""
    check_messages(messages, settings)
    if system:
        check_text("the system message", system, settings.max_message_chars)
    return ChatQuery(
        messages=messages,
        collection=access.collection(collection, settings),
        top_k=top_k or settings.top_k,
        max_tokens=max_tokens,  # None: the prompt style's default (Answerer.with_defaults)
        doc_ids=doc_ids or None,
        temperature=temperature,
        system=system or None,
    )


async def collect(
    answer: Answer | NoSourcesAnswer, on_event: Callable[[Event], Awaitable[None]] | None = None
) -> AnswerDocument:
    """The whole answer as one document; `on_event` sees each event as it comes (the MCP `ask` tool
    reports progress from it)."""

    async def events() -> AsyncIterator[Event]:
        async for event in answer.events():
            if on_event is not None:
                await on_event(event)
            yield event

    return await AnswerDocument.collect(events())
