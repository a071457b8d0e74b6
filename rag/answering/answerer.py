"""The answering core shared by /v1/chat and /v1/chat/completions: retrieve, pack, generate, cite.

`Answerer.start()` does everything that can fail with a clean HTTP status before a response begins
(bad request, question too long, embedder or llama-server down, queue full); it returns an `Answer`
holding a generation slot. `Answer.events()` then yields the answer as typed events
(rag.answering.events):

    Sources, Budget, Token*, Citations, Done

and raises a RagError if generation fails midway (the routes turn it into an `error` event). If
llama-server rejects the prompt as over its context (its n_ctx changed since we read /props), the
prompt is packed again with the server's own numbers and sent once more; fresh `sources` and `budget`
events then precede the first token, and a client keeps the last ones.

No good sources (empty collection, nothing retrieved at or above min_score, the best chunk under the
relevance floor -- `not_relevant` --, or no chunk fits): the model is not called. A fixed answer says that the documents do not cover the question and cites
nothing. A small model asked to answer "from no sources" still invents; a fixed reply cannot, costs
no generation slot, and reads the same in every language of the UI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import anyio

from rag.answering.budget import Candidate, PackedPrompt, PromptBudget
from rag.answering.citations import citations_event
from rag.answering.events import (
    Budget,
    Citations,
    Done,
    Dropped,
    Event,
    NoSourcesDone,
    NoSourcesReason,
    SourceEntry,
    Sources,
    Token,
)
from rag.answering.followup import SearchQuery, search_query
from rag.answering.gate import GenerationGate, Permit
from rag.answering.no_answer import ANSWER_LINE_GRAMMAR, no_answer_text, usable
from rag.answering.prompt import (
    COMPLETION_EXAMPLE_ANSWERS,
    COMPLETION_EXAMPLES,
    COMPLETION_STOP,
    ChatStyle,
    CompletionStyle,
    Message,
    PromptStyle,
    choose_style,
    no_sources_answer,
)
from rag.answering.retrieval import relevance, relevance_floor
from rag.clients.llm import LlamaServerClient, ServerProps, StreamDelta, StreamEnd
from rag.core.config import Settings
from rag.core.errors import BackendUnavailable, ContextOverflow, InvalidRequest, LLMUnavailable, RagError, UpstreamError

log = logging.getLogger(__name__)

PROPS_TTL_S = 30.0
SNIPPET_CHARS = 240
CLOSE_TIMEOUT_S = 5.0


class Hit(Protocol):
    """A retrieved chunk (rag.answering.retrieval.RetrievedChunk)."""

    chunk_id: str
    doc_id: str
    text: str
    metadata: dict[str, Any]
    score: float
    cosine: float | None
    coverage: float


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


@dataclass
class _Clock:
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


class Answerer:
    """Answers questions against one llama-server and one retriever."""

    def __init__(self, llm: LlamaServerClient, searcher: Searcher, settings: Settings) -> None:
        self.llm = llm
        self.searcher = searcher
        self.settings = settings
        self.budget = PromptBudget(llm)
        self.gate = GenerationGate(1, settings.queue_max, settings.queue_timeout_s)
        self._props: ServerProps | None = None
        self._props_at = 0.0
        self.style_choice = choose_style(settings.llm_prompt_style, [settings.llm_model_path])
        self._example_tokens: set[int] | None = None

    async def example_ban(self, prompt: str) -> list[list[int | bool]]:
        """llama-server `logit_bias` entries that forbid the example answers' tokens absent from the
        prompt's own part (sources, history, question): a copied example answer cannot be generated."""
        if self._example_tokens is None:
            tokens: set[int] = set()
            for answer in COMPLETION_EXAMPLE_ANSWERS:
                tokens.update(await self.llm.tokenize(f" {answer}"))
            self._example_tokens = tokens
        own = set(await self.llm.tokenize(prompt.removeprefix(COMPLETION_EXAMPLES)))
        return [[token, False] for token in sorted(self._example_tokens - own)]

    @property
    def style(self) -> PromptStyle:
        """How prompts are written for the served model (rag.answering.prompt)."""
        if self.style_choice.name == "completion":
            return CompletionStyle(self.settings.completion_max_sources)
        return ChatStyle()

    def with_defaults(self, query: ChatQuery) -> ChatQuery:
        """The query with the style's max_tokens and temperature where the request left them out."""
        completion = self.style_choice.name == "completion"
        max_tokens = query.max_tokens or (
            self.settings.completion_max_tokens if completion else self.settings.answer_reserve
        )
        temperature = query.temperature if query.temperature is not None else (0.0 if completion else 0.2)
        return replace(query, max_tokens=max_tokens, temperature=temperature)

    async def _look_ahead(self, question: str, history: bool) -> ServerProps:
        props = await self.props()
        await self.budget.warm(question, history=history, style=self.style)
        return props

    async def aclose(self) -> None:
        """Close what the searcher holds open (a reranker client); the llm client is not ours."""
        aclose = getattr(self.searcher, "aclose", None)
        if aclose is not None:
            await aclose()

    async def props(self, *, refresh: bool = False) -> ServerProps:
        """llama-server's per-slot n_ctx and slot count, re-read every PROPS_TTL_S."""
        if refresh or self._props is None or time.monotonic() - self._props_at > PROPS_TTL_S:
            try:
                self._props = await self.llm.props()
            except LLMUnavailable:
                self._props = None
                raise
            self._props_at = time.monotonic()
            self.gate.resize(self._props.total_slots)
            self.style_choice = choose_style(
                self.settings.llm_prompt_style, [self.settings.llm_model_path, self._props.model_path]
            )
        return self._props

    async def start(self, query: ChatQuery) -> Answer | NoSourcesAnswer:
        """Retrieve, pack and take a generation slot; raises the request's error, if any."""
        clock = _Clock()
        asked, query = query, self.with_defaults(query)
        history, question = split_question(query.messages)
        # llama-server's numbers and the question's token count are fetched while retrieval runs.
        ahead = asyncio.ensure_future(self._look_ahead(question, bool(history)))
        try:
            searched = await search_query(self.settings.followup_rewrite, history, question, self.llm)
            hits = list(
                await self.searcher.search(
                    searched.text, collection=query.collection, k=query.top_k, doc_ids=query.doc_ids
                )
            )
        except BaseException:
            await _discard(ahead)
            raise
        clock.mark("retrieved")
        good = [h for h in hits if h.score >= self.settings.min_score]
        below = [
            Dropped(chunk_id=h.chunk_id, reason="below_min_score") for h in hits if h.score < self.settings.min_score
        ]
        reason: NoSourcesReason = "no_match" if hits else "nothing_retrieved"
        if good and relevance(searched.text, good, self.settings) < relevance_floor(searched.text, self.settings):
            reason, good = "not_relevant", []
            below = [Dropped(chunk_id=h.chunk_id, reason="below_min_relevance") for h in hits]
        good, far = cut_off(good, self.settings.pack_relative_score)
        below += [Dropped(chunk_id=h.chunk_id, reason="far_below_best") for h in far]
        if not good:
            await self._question_fits(ahead, query, question)
            return NoSourcesAnswer(query, clock, reason, below, searched=searched, style=self.style.name)
        props = await ahead
        query = self.with_defaults(asked)  # the style may be known only now, from llama-server's model path
        by_id = {f"S{i}": hit for i, hit in enumerate(good, 1)}
        candidates = [Candidate(sid, h.chunk_id, h.text, h.metadata) for sid, h in by_id.items()]
        packed = await self.pack(query, history, question, candidates, props.n_ctx)
        packed.dropped += below
        clock.mark("packed")
        if not packed.chunks:
            return NoSourcesAnswer(
                query, clock, "no_room", packed.dropped, packed, searched=searched, style=packed.style
            )
        permit = await self.gate.acquire()
        clock.mark("admitted")
        return Answer(self, query, history, question, candidates, by_id, packed, permit, clock, searched=searched)

    async def _question_fits(self, ahead: asyncio.Future[ServerProps], query: ChatQuery, question: str) -> None:
        """Raise QuestionTooLong for a question alone over the budget, even when nothing will be generated.

        No model call either way: llama-server counts tokens, and when it is down the fixed answer needs it not.
        """
        try:
            props = await ahead
        except (BackendUnavailable, UpstreamError):
            return
        await self.pack(query, [], question, [], props.n_ctx)

    async def pack(
        self,
        query: ChatQuery,
        history: list[Message],
        question: str,
        candidates: list[Candidate],
        n_ctx: int,
        correction: int = 0,
    ) -> PackedPrompt:
        """The query's prompt packed for a context of `n_ctx` (less `correction` tokens)."""
        assert query.max_tokens is not None  # with_defaults filled it in
        return await self.budget.pack(
            question=question,
            candidates=candidates,
            history=history,
            n_ctx=n_ctx,
            reserve=query.max_tokens,
            ceiling=self.settings.context_budget,
            correction=correction,
            history_share=self.settings.history_share,
            style=self.style,
        )


class Answer:
    """One admitted question: its packed prompt and its generation slot."""

    def __init__(
        self,
        answerer: Answerer,
        query: ChatQuery,
        history: list[Message],
        question: str,
        candidates: list[Candidate],
        hits: Mapping[str, Hit],
        packed: PackedPrompt,
        permit: Permit,
        clock: _Clock,
        *,
        searched: SearchQuery | None = None,
    ) -> None:
        self.answerer = answerer
        self.query = query
        self.history = history
        self.question = question
        self.candidates = candidates
        self.hits = hits
        self.packed = packed
        self.permit = permit
        self.clock = clock
        self.searched = searched or SearchQuery(question)  # the query retrieval ran, shown with the sources
        self.text_parts: list[str] = []
        self.no_answer = False
        self.retried = False

    def close(self) -> None:
        """Give the generation slot back (idempotent; events() does it too)."""
        self.permit.release()

    def sources_event(self) -> Sources:
        sources = [source_entry(c.source_id, self.hits[c.source_id], c.text) for c in self.packed.chunks]
        return Sources(sources=sources, query=self.searched.text, rewrite=self.searched.rewrite)

    def budget_event(self) -> Budget:
        return self.packed.budget()

    async def events(self) -> AsyncIterator[Event]:
        """The answer as events; generation errors are raised (after the slot is freed)."""
        llm = self.answerer.llm
        upstream: AsyncIterator[StreamDelta | StreamEnd] | None = None
        try:
            yield self.sources_event()
            yield self.budget_event()
            self.clock.mark("upstream")
            upstream = self._generate(llm)
            try:
                first = await anext(upstream)
            except ContextOverflow as overflow:
                await _close(upstream)
                await self.repack(overflow)
                yield self.sources_event()
                yield self.budget_event()
                upstream = self._generate(llm)
                first = await anext(upstream)
            item: StreamDelta | StreamEnd = first
            while not isinstance(item, StreamEnd):
                if not self.text_parts:
                    self.clock.mark("first_token")
                self.text_parts.append(item.text)
                yield Token(text=item.text)
                item = await anext(upstream)
            self.clock.mark("generated")
            for event in self._closing_events(item):
                yield event
        finally:
            if upstream is not None:
                await _close(upstream)
            self.close()

    async def repack(self, overflow: ContextOverflow) -> None:
        """Pack again after llama-server refused the prompt, trusting its own n_ctx and count; raises the
        overflow when no source fits the server's real context (never answer without one)."""
        answerer = self.answerer
        props = await answerer.props(refresh=True)
        n_ctx = overflow.n_ctx or props.n_ctx
        correction = max(0, (overflow.n_prompt_tokens or 0) - self.packed.used)
        if correction:
            answerer.budget.forget()  # the server counts differently than our remembered pieces
        log.warning(
            "llama-server refused a %s-token prompt (its n_ctx %s, we packed for %s): packing again",
            overflow.n_prompt_tokens,
            n_ctx,
            self.packed.n_ctx,
        )
        packed = await answerer.pack(self.query, self.history, self.question, self.candidates, n_ctx, correction)
        packed.repacked = True
        self.packed = packed
        if not packed.chunks:
            raise overflow

    def _generate(self, llm: LlamaServerClient) -> AsyncIterator[StreamDelta | StreamEnd]:
        """The answer's stream, never blank (rag.answering.no_answer); a completion is retried once."""
        assert self.query.max_tokens is not None and self.query.temperature is not None
        prompt = self.packed.messages
        if isinstance(prompt, str):
            return self._never_blank(
                [
                    lambda: _lstripped(self._complete(llm, prompt)),
                    lambda: _lstripped(self._complete(llm, prompt, grammar=ANSWER_LINE_GRAMMAR)),
                ]
            )
        max_tokens, temperature = self.query.max_tokens, self.query.temperature
        assert max_tokens is not None and temperature is not None  # chat_query fills them in
        return self._never_blank([lambda: llm.stream_chat(prompt, max_tokens=max_tokens, temperature=temperature)])

    async def _never_blank(
        self, attempts: list[Callable[[], AsyncIterator[StreamDelta | StreamEnd]]]
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        """The first attempt whose text is usable, its unusable start held back until it is; if none is,
        the fixed no-answer line naming the sources."""
        end = StreamEnd(None)
        for number, attempt in enumerate(attempts):
            self.retried = number > 0
            held: list[str] | None = []
            stream = attempt()
            try:
                async for item in stream:
                    if isinstance(item, StreamEnd):
                        end = item
                    elif held is None:
                        yield item
                    elif usable(text := "".join([*held, item.text])):
                        held = None
                        yield StreamDelta(text)
                    else:
                        held.append(item.text)
            finally:
                await _close(stream)
            if held is None:
                yield end
                return
        self.no_answer = True
        yield StreamDelta(no_answer_text(c.candidate.metadata.get("source", "") for c in self.packed.chunks))
        yield end

    async def _complete(
        self, llm: LlamaServerClient, prompt: str, grammar: str | None = None
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        assert self.query.max_tokens is not None and self.query.temperature is not None
        ban = await self.answerer.example_ban(prompt)
        extra = ({"logit_bias": ban} if ban else {}) | ({"grammar": grammar} if grammar else {})
        stream = llm.stream_completion(
            prompt,
            max_tokens=self.query.max_tokens,
            temperature=self.query.temperature,
            stop=list(COMPLETION_STOP),
            extra=extra or None,
        )
        try:
            async for item in stream:
                yield item
        finally:
            await _close(stream)

    def _closing_events(self, end: StreamEnd) -> tuple[Citations, Done]:
        text = "" if self.no_answer else "".join(self.text_parts)  # our own line cites and claims nothing
        chunks = {c.source_id: c.text for c in self.packed.chunks}
        fixed_text = (CompletionStyle if self.packed.style == "completion" else ChatStyle).fixed_text
        citations, check, attribution = citations_event(text, chunks, self.hits, fixed_text=fixed_text)
        timings = end.timings or {}
        done = Done(
            usage=end.usage,
            timings=timings,
            ttft_ms=self.clock.ms(None, "first_token") if "first_token" in self.clock.marks else None,
            invalid_citations=len(check.invalid),
            cache_n=timings.get("cache_n"),
            finish_reason=end.finish_reason,
            retrieval_ms=self.clock.ms(None, "retrieved"),
            pack_ms=self.clock.ms("retrieved", "packed"),
            queue_ms=self.clock.ms("packed", "admitted"),
            upstream_ttft_ms=round(end.ttft_s * 1000, 1) if end.ttft_s is not None else None,
            style=self.packed.style,
            unsupported_sentences=attribution.unsupported,
            no_answer=self.no_answer,  # the model gave nothing usable: the text is our fixed line
            retried=self.retried,  # its first attempt gave nothing usable
        )
        return citations, done


class NoSourcesAnswer:
    """The fixed answer when no source is good enough: no model call, nothing cited, no generation slot."""

    def __init__(
        self,
        query: ChatQuery,
        clock: _Clock,
        reason: NoSourcesReason,
        dropped: list[Dropped],
        packed: PackedPrompt | None = None,
        *,
        searched: SearchQuery,
        style: str,
    ) -> None:
        self.query = query
        self.clock = clock
        self.reason = reason
        self.dropped = dropped
        self.packed = packed
        self.searched = searched
        self.style = style

    def close(self) -> None:
        """Nothing to give back: no generation slot was taken."""

    def budget_event(self) -> Budget:
        if self.packed is not None:
            return self.packed.budget()
        return Budget(reserve=self.query.max_tokens, dropped=self.dropped, style=self.style)

    async def events(self) -> AsyncIterator[Event]:
        text = no_sources_answer(self.query.collection, self.query.messages[-1]["content"])
        yield Sources(sources=[], query=self.searched.text, rewrite=self.searched.rewrite)
        yield self.budget_event()
        self.clock.mark("first_token")
        yield Token(text=text)
        yield Citations()
        yield NoSourcesDone(
            ttft_ms=self.clock.ms(None, "first_token"),
            no_sources=self.reason,
            retrieval_ms=self.clock.ms(None, "retrieved"),
        )


async def _lstripped(stream: AsyncIterator[StreamDelta | StreamEnd]) -> AsyncIterator[StreamDelta | StreamEnd]:
    """The stream without the blank a completion starts with ("Answer:" is followed by " 1887")."""
    started = False
    try:
        async for item in stream:
            if isinstance(item, StreamDelta) and not started:
                item = StreamDelta(item.text.lstrip())
                started = bool(item.text)
                if not started:
                    continue
            yield item
    finally:
        await _close(stream)


async def _discard(task: asyncio.Future[Any]) -> None:
    """Cancel a look-ahead whose result is not needed, and drop its outcome (an error included)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, RagError):
        await task


async def _close(stream: AsyncIterator[Any]) -> None:
    """Close an upstream stream at once, even inside a cancelled scope (a client that went away)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True), contextlib.suppress(RuntimeError):
        await aclose()
