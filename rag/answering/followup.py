"""Follow-up questions: the query that retrieval searches for the last question of a conversation.

"When was it built?" names nothing to search for; its subject is in the turn before. Two rewrites:

- `rule` (the default): a question that reads as a follow-up (a pronoun or a demonstrative, "what
  about ...", or only a couple of search terms) is searched together with the previous user question.
  BM25 then matches the earlier question's subject and the embedding carries both. No model call:
  it costs nothing and cannot invent a subject.
- `generator`: the generator (in chat style, for instruct models) is asked for a standalone question.
  It costs a model call before retrieval and depends on the model; a failure falls back to the rule.

`bench/followups.py` measures both on follow-ups built from SQuAD (recall@5 against the original
question's, and latency). The query searched is shown to the user in the `sources` event, so a wrong
rewrite is visible.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rag.answering.prompt import Message
from rag.core.errors import BackendUnavailable, UpstreamError
from rag.store.chunk_record import lexical_tokens

log = logging.getLogger(__name__)

# Words that point back at something said before (English; CJK pronouns and demonstratives).
_REFERS_BACK = re.compile(
    r"\b(?:it|its|itself|they|them|their|theirs|he|him|his|she|her|hers|this|that|these|those|there|then|"
    r"the latter|the former|the same|one|ones)\b|^\s*(?:and|also|what about|how about|and what)\b|[它他她其该此这那]",
    re.IGNORECASE,
)
MIN_OWN_TERMS = 3  # a question with fewer search terms than this leans on the conversation
MAX_GENERATED_CHARS = 400

REWRITE_SYSTEM = (
    "Rewrite the user's last question so that it can be understood without the conversation: replace "
    "pronouns and references with what they refer to. Reply with the rewritten question only."
)


class ChatCompleter(Protocol):
    async def complete_chat(
        self, messages: list[Message], *, max_tokens: int, temperature: float = 0.2
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SearchQuery:
    """What retrieval searches for a question, and how it was made (`off` when it is the question)."""

    text: str
    rewrite: str = "off"


def refers_back(question: str) -> bool:
    """Whether a question reads as a follow-up that needs the turn before it."""
    return bool(_REFERS_BACK.search(question)) or len(set(lexical_tokens(question))) < MIN_OWN_TERMS


def previous_question(history: Sequence[Message]) -> str | None:
    return next((m["content"] for m in reversed(history) if m["role"] == "user" and m["content"].strip()), None)


def rule_rewrite(history: Sequence[Message], question: str) -> SearchQuery:
    """The question with the previous user question before it, when it reads as a follow-up."""
    before = previous_question(history)
    if before is None or not refers_back(question):
        return SearchQuery(question)
    return SearchQuery(f"{before.strip()} {question.strip()}", "rule")


async def generator_rewrite(
    llm: ChatCompleter, history: Sequence[Message], question: str, *, max_tokens: int = 64
) -> SearchQuery:
    """A standalone question written by the generator; the rule's query when that fails or is empty."""
    fallback = rule_rewrite(history, question)
    if fallback.rewrite == "off":
        return fallback
    last_turn = list(history[-2:])
    messages: list[Message] = [
        {"role": "system", "content": REWRITE_SYSTEM},
        *last_turn,
        {"role": "user", "content": f"Rewrite this question: {question}"},
    ]
    try:
        reply = await llm.complete_chat(messages, max_tokens=max_tokens, temperature=0.0)
    except (BackendUnavailable, UpstreamError) as exc:
        log.warning("follow-up rewrite by the generator failed, using the rule: %s", exc.message)
        return fallback
    choices = reply.get("choices") or [{}]
    content = str((choices[0].get("message") or {}).get("content") or "")
    first_line = next((line for line in content.splitlines() if line.strip()), "")
    text = " ".join(first_line.split())[:MAX_GENERATED_CHARS]
    return SearchQuery(text, "generator") if text else fallback


async def search_query(
    mode: str, history: Sequence[Message], question: str, llm: ChatCompleter | None = None
) -> SearchQuery:
    """The query to search for `question` after `history`, by the configured rewrite."""
    if not history or mode == "off":
        return SearchQuery(question)
    if mode == "generator" and llm is not None:
        return await generator_rewrite(llm, history, question)
    return rule_rewrite(history, question)
