"""What one chat asks and what retrieval hands back: the query with its defaults filled in, the hits a
searcher returns, the source entries shown for them, and the clock that times an answer's steps."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rag.answering.events import (
    SourceEntry,
)
from rag.answering.prompt import (
    Message,
)
from rag.core.errors import InvalidRequest

SNIPPET_CHARS = 240


class Hit(Protocol):
    """A retrieved chunk (rag.answering.retrieval.RetrievedChunk)."""

    chunk_id: str
    doc_id: str
    text: str
    metadata: dict[str, Any]
    score: float
    cosine: float | None
    coverage: float
    dense_rank: int | None
    lexical_rank: int | None
    absent: float
    unknown_names: tuple[str, ...]


class Searcher(Protocol):
    async def search(
        self, query: str, *, collection: str, k: int, doc_ids: Iterable[str] | None = None
    ) -> Sequence[Hit]: ...


@dataclass
class ChatQuery:
    messages: list[Message]
    collection: str
    top_k: int
    max_tokens: int | None = None  # None: the prompt style's default (Answerer.with_defaults)
    doc_ids: list[str] | None = None
    temperature: float | None = None
    system: str | None = None  # a chat client's system message: the chat style passes it on (budget.py)


@dataclass
class Clock:
    started: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter()

    def ms(self, start: str | None, end: str) -> float:
        begin = self.started if start is None else self.marks[start]
        return round((self.marks[end] - begin) * 1000, 1)


def cut_off(hits: Sequence[Hit], share: float) -> tuple[list[Hit], list[Hit]]:
    """(kept, cut): hits scoring below `share` of the best one are not worth their prefill time.

    Only for positive scores (fused ones lie in [0, 1]); a reranker's logits can be negative.
    """
    best = max((h.score for h in hits), default=0.0)
    if best <= 0:
        return list(hits), []
    floor = share * best
    return [h for h in hits if h.score >= floor], [h for h in hits if h.score < floor]


def split_question(messages: Sequence[Message]) -> tuple[list[Message], str]:
    """(history, question): the question is the last message, which must come from the user."""
    if not messages:
        raise InvalidRequest("messages is empty: send at least the question as a user message")
    *history, last = messages
    if last["role"] != "user" or not last["content"].strip():
        raise InvalidRequest("the last message must be the user's question and not empty")
    for message in history:
        if message["role"] not in ("user", "assistant"):
            raise InvalidRequest(f"history roles are user and assistant, not {message['role']!r}")
    return list(history), last["content"]


def source_entry(source_id: str, hit: Hit, text: str) -> SourceEntry:
    """A source as the API shows it."""
    meta = hit.metadata
    return SourceEntry(
        id=source_id,
        chunk_id=hit.chunk_id,
        doc_id=hit.doc_id,
        source=meta.get("source", ""),
        text=text,
        snippet=snippet(text),
        score=round(float(hit.score), 4),
        page=meta.get("page"),
        heading=meta.get("heading"),
        ocr_low_confidence=meta.get("ocr_low_confidence"),
    )


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut + "…"
