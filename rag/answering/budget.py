"""The prompt budget, closed loop: pack what fits in n_ctx - max_tokens, counted by llama-server itself.

Every count comes from the generator's own chat template and tokenizer (`/apply-template` then
`/tokenize`; in the completion style the prompt string straight to `/tokenize`, with BOS as
/completion adds it); nothing is estimated from characters. The prompt style (rag.answering.prompt)
renders the sources and assembles the prompt; the packing is the same for both. To stay fast, each piece (a rendered source, a
history message) is tokenized once and remembered, the pieces are packed by their sum, and the
assembled prompt is then counted exactly once. Joining pieces can merge or split a token at a seam,
so a prompt that comes out over the limit is packed again against a target lowered by the excess.

Order of claims on the budget: the question is never cut (alone too long -> QuestionTooLong, 400);
the fixed system prompt; a chat client's own system message, in the chat style (at most
`instructions_limit` tokens: a longer one is cut at a sentence end, one whose first sentence is longer is
left out); the latest turn pair, when it costs at most `history_share` of the limit (a
follow-up must see what it follows); then the chunks in rank order (the first that does not fit is cut
at a sentence boundary, or dropped, and every lower-ranked one is dropped); then the older history,
newest turn first, whole turns only (the oldest go first).

The conversation's room (`followup_room`, at most `history_share` of the limit): the chunks never take
the last `followup_room` tokens of the limit, which are the question's and the history's. A first turn whose sources fill the budget so leaves
its follow-up room for the turn pair it adds (the answer and the next question): the follow-up, whose
question and latest turn pair fit in that room, packs the same sources into the same space, so its
prompt is the first one extended and llama-server reuses all of it. Without the room, the follow-up's
turn pair pushes the last source's cut back; on a hybrid (recurrent) model llama-server can only roll
back to a checkpoint it made one micro-batch (`-ub`) and 4 tokens before the end of the previous prompt
(and at the start of its first user message), so a cut further back than that processes everything after
the system prompt again (reuse 0.10 on an H200 machine at -ub 256, bench/README.md).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cachetools import LRUCache

from rag.answering.events import Budget, BudgetChunk, Dropped
from rag.answering.prompt import ChatStyle, Message, PromptStyle, defuse
from rag.core.errors import InvalidRequest, QuestionTooLong

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


CHAT = ChatStyle()


@dataclass
class Candidate:
    """A retrieved chunk offered to the prompt, with its source id (S1 = best ranked)."""

    source_id: str
    chunk_id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    coverage: float = 0.0  # the IDF-weighted share of the question's terms the chunk holds (retrieval's)


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

    messages: list[Message] | str  # the chat's messages, or the completion style's prompt
    n_ctx: int
    reserve: int
    limit: int
    used: int  # exact: the server's template and tokenizer on the final messages
    system: int
    question: int
    history: int
    chunks: list[PackedChunk]
    dropped: list[Dropped]
    dropped_turns: int
    rounds: int = 1
    repacked: bool = False
    kept_turns: int = 0
    latest_turn_reserved: int = 0  # tokens held for the latest turn pair before the sources (0: none)
    followup_room_held: int = 0  # tokens of the conversation's room the chunks left free for its next turn
    style: str = "chat"
    instructions: int = 0  # tokens of the client's system message in the prompt (0: none, or left out)
    instructions_cut: bool = False  # the client's system message was cut (or left out) to fit its limit

    def in_prompt(self) -> set[str]:
        return {c.source_id for c in self.chunks}

    def budget(self) -> Budget:
        """The `budget` event of the API."""
        chunks = [
            BudgetChunk(id=c.source_id, chunk_id=c.candidate.chunk_id, tokens=c.tokens, cut=c.cut) for c in self.chunks
        ]
        return Budget(
            n_ctx=self.n_ctx,
            reserve=self.reserve,
            limit=self.limit,
            used=self.used,
            system=self.system,
            history=self.history,
            question=self.question,
            chunks=chunks,
            dropped=self.dropped,
            dropped_turns=self.dropped_turns,
            kept_turns=self.kept_turns,
            latest_turn_reserved=self.latest_turn_reserved,
            followup_room_held=self.followup_room_held,
            rounds=self.rounds,
            repacked=self.repacked,
            style=self.style,
            client_system=self.instructions,
            client_system_cut=self.instructions_cut,
        )


@dataclass(frozen=True)
class _Limits:
    """The context numbers of one pack: `limit` is what the prompt may use."""

    n_ctx: int
    reserve: int
    limit: int


@dataclass
class _Pieces:
    """What one pack measured: the pieces of the prompt and their token counts."""

    question: str
    style: PromptStyle
    candidates: list[Candidate]  # those the style takes, in rank order
    over_style: list[Candidate]  # those past the style's number of sources
    chunk_tokens: list[int]
    turns: list[list[Message]]
    skeleton: int  # the system prompt and the template, without the question
    instructions: int  # the client's system message as the style adds it (0: none)
    instructions_cut: bool
    question_tokens: int
    per_message: int  # template tokens around one history message
    wrapper: int  # the tokens around the sources block, when there are sources
    base: int  # the system prompt, the template, the client's instructions and the question
    limits: _Limits

    @property
    def numbers(self) -> dict[str, int]:
        """What a QuestionTooLong reports."""
        return {
            "question_tokens": self.question_tokens,
            "limit": self.limits.limit,
            "n_ctx": self.limits.n_ctx,
            "reserve": self.limits.reserve,
        }


def _limits(n_ctx: int, reserve: int, ceiling: int | None, correction: int) -> _Limits:
    """The prompt's limit: the context (capped by `ceiling`) less the answer's reserve and a correction."""
    context = min(n_ctx, ceiling or n_ctx)
    limit = context - reserve - max(correction, 0)
    if limit <= 0:
        raise InvalidRequest(
            f"max_tokens {reserve} leaves no room for a prompt in a context of {context} tokens",
            n_ctx=n_ctx,
            context=context,
            reserve=reserve,
        )
    return _Limits(n_ctx, reserve, limit)


def sentence_ends(text: str) -> list[int]:
    """Offsets just after each sentence end inside `text` (the end of the text is not listed)."""
    ends: list[int] = []
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
        self._counts: LRUCache[str, int] = LRUCache(maxsize=size)

    async def count(self, text: str) -> int:
        if (n := self._counts.get(text)) is not None:
            return n
        n = self._counts[text] = len(await self._counter.tokenize(text))
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
        self._per_message: dict[str, int] = {}  # per style: template tokens around one history message
        self._skeleton_tokens: dict[str, int] = {}  # per style: the prompt with no sources, history, question

    def forget(self) -> None:
        """Drop remembered counts (the server may have changed its model)."""
        self._memo.clear()
        self._per_message.clear()
        self._skeleton_tokens.clear()

    async def _count(self, prompt: list[Message] | str) -> int:
        """Exact prompt tokens: a chat through the server's template, a completion prompt as /completion sees it."""
        if isinstance(prompt, str):
            return len(await self._counter.tokenize(prompt, add_special=True))
        return await self._counter.count_chat_tokens(prompt)

    async def warm(self, question: str, *, history: bool = False, style: PromptStyle = CHAT) -> None:
        """Count ahead what every pack of this question needs (run it while retrieval runs)."""
        await asyncio.gather(
            self._skeleton(style),
            self._memo.count(defuse(question)),
            self._memo.count(style.wrapper()),
            self._per_message_overhead(style) if history else _zero(),
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
        followup_room: int = 0,
        style: PromptStyle = CHAT,
        instructions_limit: int | None = None,
    ) -> PackedPrompt:
        """Pack the prompt. `ceiling` caps the context we use; `correction` lowers the limit further;
        `history_share` of the limit may be held for the latest turn pair before the sources;
        `followup_room` tokens of the limit (at most `history_share` of it) are the question's and the
        history's, never the chunks'; the style's client instructions take at most `instructions_limit`
        tokens (None: all of them)."""
        limits = _limits(n_ctx, reserve, ceiling, correction)
        pieces = await self._measure(question, candidates, split_turns(history), style, limits, instructions_limit)
        latest = await self._latest_turn_reserve(pieces, history_share, limits.limit)
        # The room the question and the latest turn pair do not use yet is held from the chunks too; it is
        # at most the latest turn pair's share (a smaller context than configured holds proportionally less).
        room = min(followup_room, int(history_share * limits.limit))
        held = max(0, room - pieces.question_tokens - latest)
        target = limits.limit
        for round_no in range(1, MAX_ROUNDS + 1):
            packed = await self._pack_round(pieces, target - latest, latest, limits, held)
            packed.rounds = round_no
            if packed.used <= limits.limit:
                return packed
            if not packed.chunks and not packed.kept_turns:
                raise _too_long(packed.used, pieces.numbers)  # nothing left to drop: the question alone is over
            target -= packed.used - limits.limit
        return await self._question_only(pieces, limits)

    async def _measure(
        self,
        question: str,
        candidates: Sequence[Candidate],
        turns: list[list[Message]],
        style: PromptStyle,
        limits: _Limits,
        instructions_limit: int | None = None,
    ) -> _Pieces:
        """Every piece's tokens in one round of concurrent /tokenize calls (remembered pieces cost none);
        refuses a question that with the system prompt alone is over the limit (the client's instructions
        are left out first)."""
        kept, over = style.take(candidates)
        rendered = [style.render_source(c.source_id, c.text, c.metadata) for c in kept]
        fitted, skeleton, question_tokens, chunk_tokens, per_message, wrapper = await asyncio.gather(
            self._fit_instructions(style, instructions_limit),
            self._skeleton(style),
            self._memo.count(defuse(question)),
            self._memo.count_all(rendered),
            self._per_message_overhead(style) if turns else _zero(),
            self._memo.count(style.wrapper()) if kept else _zero(),
        )
        style, instructions, instructions_cut = fitted
        pieces = _Pieces(
            question=question,
            style=style,
            candidates=kept,
            over_style=over,
            chunk_tokens=chunk_tokens,
            turns=turns,
            skeleton=skeleton,
            instructions=instructions,
            instructions_cut=instructions_cut,
            question_tokens=question_tokens,
            per_message=per_message,
            wrapper=wrapper,
            base=skeleton + instructions + question_tokens,
            limits=limits,
        )
        if pieces.base > limits.limit and instructions:  # the question comes first: no client instructions
            pieces.style, pieces.instructions, pieces.instructions_cut = style.with_instructions(""), 0, True
            pieces.base -= instructions
        if pieces.base > limits.limit:  # the sum of pieces may be off at a seam: count the question alone exactly
            pieces.base = await self._count(pieces.style.build([], [], question))
            if pieces.base > limits.limit:
                raise _too_long(pieces.base, pieces.numbers)
        return pieces

    async def _fit_instructions(self, style: PromptStyle, limit: int | None) -> tuple[PromptStyle, int, bool]:
        """(the style, its instructions' tokens, whether they were cut): whole when they fit in `limit`,
        else their longest run of whole sentences that does, else none."""
        if not style.instructions:
            return style, 0, False
        whole = await self._memo.count(style.instructions_text())
        if limit is None or whole <= limit:
            return style, whole, False
        fitted = await self._fitting_prefix(
            style.instructions, lambda prefix: style.with_instructions(prefix).instructions_text(), limit
        )
        if fitted is None:
            return style.with_instructions(""), 0, True
        prefix, tokens = fitted
        return style.with_instructions(prefix), tokens, True

    async def _latest_turn_reserve(self, pieces: _Pieces, history_share: float, limit: int) -> int:
        """Tokens held for the latest turn pair before the sources: its cost, when that is at most
        `history_share` of the limit and fits beside the question; else 0."""
        if not pieces.turns or history_share <= 0:
            return 0
        latest = await self._turn_cost(pieces.turns[-1], pieces.per_message)
        fits = 0 < latest <= min(int(history_share * limit), limit - pieces.base - pieces.wrapper)
        return latest if fits else 0

    async def _pack_round(
        self, pieces: _Pieces, room: int, latest: int, limits: _Limits, held: int = 0
    ) -> PackedPrompt:
        """One round: chunks, then older turns, into `room` (the latest turn pair's `latest` is held
        apart, and `held` more from the chunks alone); the assembled prompt is counted exactly."""
        style = pieces.style
        chunks, dropped, room = await self._pack_chunks(
            pieces.candidates, pieces.chunk_tokens, room - pieces.base - pieces.wrapper - held, style
        )
        room += held  # what the chunks left, and the held room, are the older history's
        dropped += [Dropped(chunk_id=c.chunk_id, reason="style_limit") for c in pieces.over_style]
        older = pieces.turns[:-1] if latest else pieces.turns
        kept_turns, history_tokens = await self._pack_history(older, room, pieces.per_message)
        if latest:
            kept_turns, history_tokens = [*kept_turns, pieces.turns[-1]], history_tokens + latest
        sources = [style.render_source(c.source_id, c.text, c.candidate.metadata) for c in chunks]
        messages = style.build(sources, [m for turn in kept_turns for m in turn], pieces.question)
        return PackedPrompt(
            messages=messages,
            n_ctx=limits.n_ctx,
            reserve=limits.reserve,
            limit=limits.limit,
            used=await self._count(messages),
            system=pieces.skeleton,
            question=pieces.question_tokens,
            history=history_tokens,
            chunks=chunks,
            dropped=dropped,
            dropped_turns=len(pieces.turns) - len(kept_turns),
            kept_turns=len(kept_turns),
            latest_turn_reserved=latest,
            followup_room_held=held,
            style=style.name,
            instructions=pieces.instructions,
            instructions_cut=pieces.instructions_cut,
        )

    async def _question_only(self, pieces: _Pieces, limits: _Limits) -> PackedPrompt:
        """Seams kept adding tokens for MAX_ROUNDS rounds: the question alone, counted exactly."""
        messages = pieces.style.build([], [], pieces.question)
        used = await self._count(messages)
        if used > limits.limit:
            raise _too_long(used, pieces.numbers)
        return PackedPrompt(
            messages=messages,
            n_ctx=limits.n_ctx,
            reserve=limits.reserve,
            limit=limits.limit,
            used=used,
            system=pieces.skeleton,
            question=pieces.question_tokens,
            history=0,
            chunks=[],
            dropped=[Dropped(chunk_id=c.chunk_id, reason="budget") for c in pieces.candidates],
            dropped_turns=len(pieces.turns),
            rounds=MAX_ROUNDS + 1,
            style=pieces.style.name,
            instructions=pieces.instructions,
            instructions_cut=pieces.instructions_cut,
        )

    async def _pack_chunks(
        self, candidates: Sequence[Candidate], tokens: list[int], room: int, style: PromptStyle
    ) -> tuple[list[PackedChunk], list[Dropped], int]:
        """Chunks in rank order while they fit; the first misfit is cut at a sentence end or dropped."""
        packed: list[PackedChunk] = []
        for i, candidate in enumerate(candidates):
            if tokens[i] <= room:
                packed.append(PackedChunk(candidate, candidate.text, tokens[i], cut=False))
                room -= tokens[i]
                continue
            cut = await self._cut(candidate, room, style)
            if cut is not None:
                packed.append(cut)
                room -= cut.tokens
            rest = candidates[i + (1 if cut else 0) :]
            return packed, [Dropped(chunk_id=c.chunk_id, reason="budget") for c in rest], room
        return packed, [], room

    async def _cut(self, candidate: Candidate, room: int, style: PromptStyle) -> PackedChunk | None:
        """The longest prefix of whole sentences whose rendered source fits in `room`."""
        fitted = await self._fitting_prefix(
            candidate.text, lambda prefix: style.render_source(candidate.source_id, prefix, candidate.metadata), room
        )
        return PackedChunk(candidate, fitted[0], fitted[1], cut=True) if fitted else None

    async def _fitting_prefix(self, text: str, render: Callable[[str], str], room: int) -> tuple[str, int] | None:
        """(prefix, tokens): the longest prefix of whole sentences of `text` whose rendering fits in `room`."""
        text = text.strip()
        ends = sentence_ends(text)
        best: tuple[str, int] | None = None
        lo, hi = 0, len(ends) - 1
        while lo <= hi:  # token counts grow with the prefix: binary search
            mid = (lo + hi) // 2
            prefix = text[: ends[mid]].rstrip()
            n = await self._memo.count(render(prefix))
            if n <= room:
                best = (prefix, n)
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

    async def _skeleton(self, style: PromptStyle) -> int:
        """Tokens of a prompt with no sources and no history, less its question (measured once per style and
        language of its examples)."""
        if style.key not in self._skeleton_tokens:
            probe = await self._count(style.with_instructions("").build([], [], "x"))
            self._skeleton_tokens[style.key] = probe - await self._memo.count("x")
        return self._skeleton_tokens[style.key]

    async def _per_message_overhead(self, style: PromptStyle) -> int:
        """Template tokens around one history message (measured once per style)."""
        if style.key not in self._per_message:
            plain = style.with_instructions("")
            probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]
            with_turn = await self._count(plain.build([], probe, "x"))
            without = await self._count(plain.build([], [], "x"))
            x = await self._memo.count("x")
            self._per_message[style.key] = max(0, -(-(with_turn - without - 2 * x) // 2))  # rounded up
        return self._per_message[style.key]


async def _zero() -> int:
    return 0


def _too_long(prompt_tokens: int, numbers: dict[str, int]) -> QuestionTooLong:
    return QuestionTooLong(
        f"the question needs {prompt_tokens} prompt tokens with the system prompt; the limit is {numbers['limit']} "
        f"(n_ctx {numbers['n_ctx']} - {numbers['reserve']} reserved for the answer)",
        prompt_tokens=prompt_tokens,
        **numbers,
    )
