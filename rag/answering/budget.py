"""The prompt budget, closed loop: pack what fits in n_ctx - max_tokens, counted by llama-server itself.

Every count comes from the generator's own chat template and tokenizer (`/apply-template` then
`/tokenize`); nothing is estimated from characters. To stay fast, each piece (a rendered source, a
history message) is tokenized once and remembered, the pieces are packed by their sum, and the
assembled prompt is then counted exactly once. Joining pieces can merge or split a token at a seam,
so a prompt that comes out over the limit is packed again against a target lowered by the excess.

Order of claims on the budget: the question is never cut (alone too long -> QuestionTooLong, 400);
the fixed system prompt; the latest turn pair, when it costs at most `history_share` of the limit (a
follow-up must see what it follows); then the chunks in rank order (the first that does not fit is cut
at a sentence boundary, or dropped, and every lower-ranked one is dropped); then the older history,
newest turn first, whole turns only (the oldest go first).
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rag.core.errors import InvalidRequest, QuestionTooLong
from rag.answering.prompt import SOURCES_SEPARATOR, Message, build_messages, defuse, render_source, sources_block

MAX_ROUNDS = 4  # assembled prompt over the limit -> lower the target and pack again, at most this often

# A sentence ends at . ! ? (then closing quotes/brackets and a space or the end), at the Chinese
# 。！？；… (no space needed), or at a blank line. Abbreviations and initials are not ends.
_SENTENCE_END = re.compile(
    r"""(?:(?<=[.!?])["'”’)\]]*(?=\s|$))|(?:(?<=[。！？；…])[”’」』）】]*)|(?:(?<=\n)(?=\n))""",
)
_NOT_AN_END = re.compile(r"(?:\b(?:[A-Za-z]|e\.g|i\.e|etc|vs|Dr|Mr|Mrs|Ms|Prof|St|Fig|cf)\.)$")


class TokenCounter(Protocol):
    """What the budget needs from llama-server (LlamaServerClient is one)."""

    async def tokenize(self, content: str, *, add_special: bool = False) -> list[int]: ...

    async def count_chat_tokens(self, messages: list[Message]) -> int: ...


@dataclass
class Candidate:
    """A retrieved chunk offered to the prompt, with its source id (S1 = best ranked)."""

    source_id: str
    chunk_id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class PackedChunk:
    candidate: Candidate
    text: str  # the whole chunk, or a prefix of whole sentences
    tokens: int
    cut: bool

    @property
    def source_id(self) -> str:
        return self.candidate.source_id


@dataclass
class PackedPrompt:
    """The messages to send and the accounts of how they were packed."""

    messages: list[Message]
    n_ctx: int
    reserve: int
    limit: int
    used: int  # exact: the server's template and tokenizer on the final messages
    system: int
    question: int
    history: int
    chunks: list[PackedChunk]
    dropped: list[dict[str, str]]
    dropped_turns: int
    rounds: int = 1
    repacked: bool = False
    kept_turns: int = 0
    latest_turn_reserved: int = 0  # tokens held for the latest turn pair before the sources (0: none)

    def in_prompt(self) -> set[str]:
        return {c.source_id for c in self.chunks}

    def to_dict(self) -> dict[str, Any]:
        """The `budget` event of the API."""
        return {
            "n_ctx": self.n_ctx,
            "reserve": self.reserve,
            "limit": self.limit,
            "used": self.used,
            "system": self.system,
            "history": self.history,
            "question": self.question,
            "chunks": [
                {"id": c.source_id, "chunk_id": c.candidate.chunk_id, "tokens": c.tokens, "cut": c.cut}
                for c in self.chunks
            ],
            "dropped": self.dropped,
            "dropped_turns": self.dropped_turns,
            "kept_turns": self.kept_turns,
            "latest_turn_reserved": self.latest_turn_reserved,
            "rounds": self.rounds,
            "repacked": self.repacked,
        }


def sentence_ends(text: str) -> list[int]:
    """Offsets just after each sentence end inside `text` (the end of the text is not listed)."""
    ends = []
    for match in _SENTENCE_END.finditer(text):
        end = match.end()
        if 0 < end < len(text) and not _NOT_AN_END.search(text[: match.start()]):
            if not ends or ends[-1] != end:
                ends.append(end)
    return ends


def split_turns(history: Sequence[Message]) -> list[list[Message]]:
    """Group the history into turns: a user message with the replies after it."""
    turns: list[list[Message]] = []
    for message in history:
        if message["role"] == "user" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return turns


class _Memo:
    """Token counts of texts already seen (bounded; shared across requests)."""

    def __init__(self, counter: TokenCounter, size: int = 8192) -> None:
        self._counter = counter
        self._size = size
        self._counts: OrderedDict[str, int] = OrderedDict()

    async def count(self, text: str) -> int:
        if text in self._counts:
            self._counts.move_to_end(text)
            return self._counts[text]
        n = len(await self._counter.tokenize(text))
        self._counts[text] = n
        if len(self._counts) > self._size:
            self._counts.popitem(last=False)
        return n

    async def count_all(self, texts: Sequence[str]) -> list[int]:
        return list(await asyncio.gather(*(self.count(t) for t in texts)))

    def clear(self) -> None:
        self._counts.clear()


class PromptBudget:
    """Packs prompts for one llama-server; keeps piece counts and the template's per-turn overhead."""

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        self._memo = _Memo(counter)
        self._per_message: int | None = None  # template tokens around one history message
        self._skeleton_tokens: int | None = None  # the prompt with no sources, no history, no question

    def forget(self) -> None:
        """Drop remembered counts (the server may have changed its model)."""
        self._memo.clear()
        self._per_message = None
        self._skeleton_tokens = None

    async def warm(self, question: str, *, history: bool = False) -> None:
        """Count ahead what every pack of this question needs (run it while retrieval runs)."""
        await asyncio.gather(
            self._skeleton(), self._memo.count(defuse(question)), self._memo.count(sources_block([]) + SOURCES_SEPARATOR),
            self._per_message_overhead() if history else _zero(),
        )

    async def pack(
        self,
        *,
        question: str,
        candidates: Sequence[Candidate],
        history: Sequence[Message] = (),
        n_ctx: int,
        reserve: int,
        ceiling: int | None = None,
        correction: int = 0,
        history_share: float = 0.0,
    ) -> PackedPrompt:
        """Pack the prompt. `ceiling` caps the context we use; `correction` lowers the limit further;
        `history_share` of the limit may be held for the latest turn pair before the sources."""
        context = min(n_ctx, ceiling or n_ctx)
        limit = context - reserve - max(correction, 0)
        if limit <= 0:
            raise InvalidRequest(
                f"max_tokens {reserve} leaves no room for a prompt in a context of {context} tokens",
                n_ctx=n_ctx, context=context, reserve=reserve,
            )
        rendered = [render_source(c.source_id, c.text, c.metadata) for c in candidates]
        turns = split_turns(history)
        # One round of concurrent /tokenize calls (remembered pieces cost none), then one exact count.
        skeleton, question_tokens, chunk_tokens, per_message, wrapper = await asyncio.gather(
            self._skeleton(), self._memo.count(defuse(question)), self._memo.count_all(rendered),
            self._per_message_overhead() if turns else _zero(),
            self._memo.count(sources_block([]) + SOURCES_SEPARATOR) if candidates else _zero(),
        )
        base = skeleton + question_tokens  # the system prompt, the template and the question
        numbers = {"question_tokens": question_tokens, "limit": limit, "n_ctx": n_ctx, "reserve": reserve}
        if base > limit:
            base = await self._counter.count_chat_tokens(build_messages([], [], question))
            if base > limit:
                raise _too_long(base, numbers)

        latest = await self._turn_cost(turns[-1], per_message) if turns and history_share > 0 else 0
        reserve_latest = 0 < latest <= min(int(history_share * limit), limit - base - wrapper)
        older = turns[:-1] if reserve_latest else turns
        target = limit
        for round_no in range(1, MAX_ROUNDS + 1):
            room = target - base - wrapper - (latest if reserve_latest else 0)
            chunks, dropped, room = await self._pack_chunks(candidates, rendered, chunk_tokens, room)
            kept_turns, history_tokens = await self._pack_history(older, room, per_message)
            if reserve_latest:
                kept_turns, history_tokens = kept_turns + [turns[-1]], history_tokens + latest
            kept_history = [m for turn in kept_turns for m in turn]
            messages = build_messages(
                [render_source(c.source_id, c.text, c.candidate.metadata) for c in chunks], kept_history, question
            )
            used = await self._counter.count_chat_tokens(messages)
            if used <= limit:
                return PackedPrompt(
                    messages=messages, n_ctx=n_ctx, reserve=reserve, limit=limit, used=used,
                    system=skeleton, question=question_tokens, history=history_tokens,
                    chunks=chunks, dropped=dropped, dropped_turns=len(turns) - len(kept_turns), rounds=round_no,
                    kept_turns=len(kept_turns), latest_turn_reserved=latest if reserve_latest else 0,
                )
            if not chunks and not kept_history:
                raise _too_long(used, numbers)  # nothing left to drop: the question alone is over
            target -= used - limit
        # Seams kept adding tokens: send the question alone, counted exactly.
        messages = build_messages([], [], question)
        used = await self._counter.count_chat_tokens(messages)
        if used > limit:
            raise _too_long(used, numbers)
        return PackedPrompt(
            messages=messages, n_ctx=n_ctx, reserve=reserve, limit=limit, used=used,
            system=skeleton, question=question_tokens, history=0, chunks=[],
            dropped=[{"chunk_id": c.chunk_id, "reason": "budget"} for c in candidates],
            dropped_turns=len(turns), rounds=MAX_ROUNDS + 1,
        )

    async def _pack_chunks(
        self, candidates: Sequence[Candidate], rendered: list[str], tokens: list[int], room: int
    ) -> tuple[list[PackedChunk], list[dict[str, str]], int]:
        """Chunks in rank order while they fit; the first misfit is cut at a sentence end or dropped."""
        packed: list[PackedChunk] = []
        for i, candidate in enumerate(candidates):
            if tokens[i] <= room:
                packed.append(PackedChunk(candidate, candidate.text, tokens[i], cut=False))
                room -= tokens[i]
                continue
            cut = await self._cut(candidate, room)
            if cut is not None:
                packed.append(cut)
                room -= cut.tokens
            rest = candidates[i + (1 if cut else 0) :]
            return packed, [{"chunk_id": c.chunk_id, "reason": "budget"} for c in rest], room
        return packed, [], room

    async def _cut(self, candidate: Candidate, room: int) -> PackedChunk | None:
        """The longest prefix of whole sentences whose rendered source fits in `room`."""
        ends = sentence_ends(candidate.text.strip())
        text = candidate.text.strip()
        best: PackedChunk | None = None
        lo, hi = 0, len(ends) - 1
        while lo <= hi:  # token counts grow with the prefix: binary search
            mid = (lo + hi) // 2
            prefix = text[: ends[mid]].rstrip()
            n = await self._memo.count(render_source(candidate.source_id, prefix, candidate.metadata))
            if n <= room:
                best = PackedChunk(candidate, prefix, n, cut=True)
                lo = mid + 1
            else:
                hi = mid - 1
        return best

    async def _pack_history(
        self, turns: list[list[Message]], room: int, per_message: int
    ) -> tuple[list[list[Message]], int]:
        """Whole turns, newest first, while they fit."""
        kept: list[list[Message]] = []
        used = 0
        for turn in reversed(turns):
            cost = await self._turn_cost(turn, per_message)
            if cost > room:
                break
            kept.insert(0, turn)
            room -= cost
            used += cost
        return kept, used

    async def _turn_cost(self, turn: list[Message], per_message: int) -> int:
        return sum(await self._memo.count_all([defuse(m["content"]) for m in turn])) + per_message * len(turn)

    async def _skeleton(self) -> int:
        """Tokens of a prompt with no sources and no history, less its question (measured once)."""
        if self._skeleton_tokens is None:
            probe = await self._counter.count_chat_tokens(build_messages([], [], "x"))
            self._skeleton_tokens = probe - await self._memo.count("x")
        return self._skeleton_tokens

    async def _per_message_overhead(self) -> int:
        """Template tokens around one history message (measured once)."""
        if self._per_message is None:
            probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]
            with_turn = await self._counter.count_chat_tokens(build_messages([], probe, "x"))
            without = await self._counter.count_chat_tokens(build_messages([], [], "x"))
            x = await self._memo.count("x")
            self._per_message = max(0, -(-(with_turn - without - 2 * x) // 2))  # rounded up
        return self._per_message


async def _zero() -> int:
    return 0


def _too_long(prompt_tokens: int, numbers: dict[str, int]) -> QuestionTooLong:
    return QuestionTooLong(
        f"the question needs {prompt_tokens} prompt tokens with the system prompt; the limit is {numbers['limit']} "
        f"(n_ctx {numbers['n_ctx']} - {numbers['reserve']} reserved for the answer)",
        prompt_tokens=prompt_tokens, **numbers,
    )
