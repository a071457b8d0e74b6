"""Follow-ups extend the previous prompt: the sources a conversation's last turn sent, kept in their order.

llama-server reuses the longest prefix its slot still holds (and on a hybrid model such as Qwen3.6 it
can roll its recurrent state back only to a checkpoint near the end of the previous prompt). A follow-up
whose sources came out in another order, or with fewer sources in front, leaves that prefix in the
middle of the sources and processes the rest again: 343-498 new tokens, 0.53 s to the first token on an
H200 machine, against ~4 new tokens when the prompt is the previous one extended.

So each packed prompt's sources are remembered (`SentSources`, bounded, in memory), keyed by the
conversation's user turns up to that question; the next turn of the same conversation looks them up
and orders its own retrieved chunks: first those the previous prompt sent, in that order (one that was
cut at a sentence is offered cut the same way), then the others by rank. The budget then packs in that
order and drops from the end, so the sources block starts as it did before.

Only chunks this request retrieved itself are reordered (its own collection and filters), and a cut is
a length applied to the chunk's own text: the map is a hint about order, never a source of text. Two conversations that asked the same questions share an entry, which orders
the same retrieved chunks alike. The map lives in each API process; on PostgreSQL (RAG_DATABASE_URL) every
replica shares it (rag.answering.shared_sent), so a follow-up sent through another replica finds it too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from cachetools import LRUCache

from rag.answering.prompt import Message
from rag.answering.query import Hit

MAX_CONVERSATIONS = 1024


@dataclass(frozen=True)
class Sent:
    """One source as a prompt sent it: the chunk, and its text's length when it was cut."""

    chunk_id: str
    cut_chars: int | None = None


def questions_so_far_key(collection: str, doc_ids: Sequence[str] | None, user_turns: Sequence[str]) -> str:
    """Every question of a conversation so far, in its collection and filters, as a key: what its next
    turn looks its previous prompt's sources up by (the answers are left out: a client may send an answer
    back reformatted, and the order depends on the questions alone). Not the pool's
    `first_question_key`, which names the conversation across all its turns."""
    payload = json.dumps([collection, sorted(doc_ids) if doc_ids else None, list(user_turns)], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def user_turns(messages: Sequence[Message]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]


@dataclass(frozen=True)
class Ordered:
    """Hits in prompt order, each with the text to offer the budget."""

    hits: list[Hit]
    texts: list[str]
    kept: int  # how many lead the list because the previous prompt sent them


class SentSources:
    """The sources of recent prompts, by conversation (least recently used forgotten first)."""

    def __init__(self, size: int = MAX_CONVERSATIONS) -> None:
        self._sent: LRUCache[str, list[Sent]] = LRUCache(maxsize=size)

    def remember(self, key: str, sent: Sequence[Sent]) -> None:
        self._sent[key] = list(sent)

    def previous(self, key: str) -> list[Sent]:
        return list(self._sent.get(key, ()))

    async def recall(self, key: str | None, hits: Sequence[Hit]) -> Ordered:
        """`order`, where the memory may be another process's (the shared one asks the database)."""
        return self.order(key, hits)

    async def keep(self, key: str, sent: Sequence[Sent]) -> None:
        """`remember`, where the memory may be another process's."""
        self.remember(key, sent)

    def order(self, key: str | None, hits: Sequence[Hit]) -> Ordered:
        """`hits` (rank order) with the previous prompt's sources first, in its order and cut as it was."""
        previous = self.previous(key) if key else []
        by_chunk = {h.chunk_id: h for h in hits}
        first: list[tuple[Hit, str]] = []
        for sent in previous:
            hit = by_chunk.pop(sent.chunk_id, None)
            if hit is None:
                continue
            text = hit.text
            if sent.cut_chars is not None and 0 < sent.cut_chars < len(text.strip()):
                text = text.strip()[: sent.cut_chars]
            first.append((hit, text))
        rest = [(h, h.text) for h in hits if h.chunk_id in by_chunk]
        ordered = first + rest
        return Ordered([h for h, _ in ordered], [t for _, t in ordered], len(first))
