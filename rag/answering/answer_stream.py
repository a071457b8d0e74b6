"""One answer being given: `Answer` streams a generated answer's events while it holds a generation slot;
`NoSourcesAnswer` gives the fixed "not in the documents" answer without one (see rag.answering.answerer)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio

from rag.answering.budget import Candidate, PackedPrompt, PromptBudget, sentence_ends
from rag.answering.citations import citations_event
from rag.answering.events import (
    Budget,
    Citations,
    Done,
    Dropped,
    Event,
    NoSourcesDone,
    NoSourcesReason,
    Sources,
    Token,
)
from rag.answering.followup import SearchQuery
from rag.answering.gate import Permit
from rag.answering.no_answer import ANSWER_LINE_GRAMMAR, counts_up, echoes, no_answer_text, unsure_text, usable
from rag.answering.prompt import (
    COMPLETION_STOP,
    EXAMPLES,
    EXAMPLES_ZH,
    ChatStyle,
    CompletionStyle,
    Message,
    in_chinese,
    no_sources_answer,
)
from rag.answering.query import ChatQuery, Clock, Hit, source_entry
from rag.answering.repetition import LoopGuard
from rag.answering.spans import is_span, source_lines, span_grammar
from rag.clients.backends import LLMBackend
from rag.clients.llm import ServerProps, StreamDelta, StreamEnd
from rag.clients.llm_pool import first_question_key
from rag.core.config import Settings
from rag.core.errors import ContextOverflow, RagError


class Answering(Protocol):
    """What an answer uses of the Answerer that started it (rag.answering.answerer), which imports this module."""

    llm: LLMBackend
    budget: PromptBudget
    settings: Settings

    async def props(self, *, refresh: bool = False) -> ServerProps: ...

    async def example_ban(self, prompt: str) -> list[list[int | bool]]: ...

    async def pack(
        self,
        query: ChatQuery,
        history: list[Message],
        question: str,
        candidates: list[Candidate],
        n_ctx: int,
        correction: int = 0,
        *,
        searched: SearchQuery | None = None,
    ) -> PackedPrompt: ...


log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Read:
    """An answer read from the first source without the model, and where (the done event's finish_reason):
    "table_cell" (rag.answering.focus.named_cell), "stated_count" (rag.answering.counts.stated_count) or
    "list_entry" (rag.answering.definitions.named_entry)."""

    text: str
    where: Literal["table_cell", "stated_count", "list_entry"]


@dataclass(frozen=True)
class Retry:
    """Why an answer line was asked again, and the line: `blank`, `echo` (of the question), `counting`
    (it only counted: "1, 2, 3, 4, …"), `off_span`."""

    reason: Literal["blank", "echo", "counting", "off_span"]
    text: str


class Answer:
    """One admitted question: its packed prompt and its generation slot."""

    def __init__(
        self,
        answerer: Answering,
        query: ChatQuery,
        history: list[Message],
        question: str,
        candidates: list[Candidate],
        hits: Mapping[str, Hit],
        packed: PackedPrompt,
        permit: Permit,
        clock: Clock,
        *,
        searched: SearchQuery | None = None,
        read: Read | None = None,
    ) -> None:
        self.answerer = answerer
        self.query = query
        self.history = history
        self.question = question
        # A pool of llama-servers sends each turn of a conversation where the previous one left its prompt.
        self.affinity = first_question_key([*history, {"role": "user", "content": question}])
        self.candidates = candidates
        self.hits = hits
        self.packed = packed
        self.permit = permit
        self.clock = clock
        self.searched = searched or SearchQuery(question)  # the query retrieval ran, shown with the sources
        self.text_parts: list[str] = []
        self.no_answer = False
        self.unsure = False  # the model's line fell below the likelihood floor: withheld
        self.retried = False
        self.retry: Retry | None = None  # why the completion style's first answer line was asked again
        self.read = read  # the answer read from a table's cell or a list's entry: no generation

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
        packed = await answerer.pack(
            self.query,
            self.history,
            self.question,
            self.candidates,
            n_ctx,
            correction,
            searched=self.searched,
        )
        packed.repacked = True
        self.packed = packed
        if not packed.chunks:
            raise overflow

    def _generate(self, llm: LLMBackend) -> AsyncIterator[StreamDelta | StreamEnd]:
        """The answer's stream, never blank (rag.answering.no_answer); a completion is retried once."""
        assert self.query.max_tokens is not None and self.query.temperature is not None
        prompt = self.packed.messages
        if isinstance(prompt, str):
            if self.read is not None:
                return _told(self.read)
            return self._never_blank(
                [lambda: self._answer_line(llm, prompt), lambda: self._retry_line(llm, prompt)],
                # Spans off: the line streams as generated, and only a blank one is asked again.
                judge=(lambda text: self._judge_line(text, prompt))
                if self.answerer.settings.completion_spans == "retry"
                else None,
            )
        max_tokens, temperature = self.query.max_tokens, self.query.temperature
        assert max_tokens is not None and temperature is not None  # chat_query fills them in
        sentences = self.answerer.settings.chat_max_sentences or 0
        return self._never_blank(
            [
                lambda: _until_sentences(
                    llm.stream_chat(prompt, max_tokens=max_tokens, temperature=temperature, affinity=self.affinity),
                    sentences,
                    self.packed.used,
                )
            ]
        )

    async def _never_blank(
        self,
        attempts: list[Callable[[], AsyncIterator[StreamDelta | StreamEnd]]],
        judge: Callable[[str], Retry | None] | None = None,
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        """The first attempt whose text is usable, its unusable start held back until it is; if none is,
        the fixed no-answer line naming the sources. With a `judge` (the completion style's one line), each
        attempt's whole line is held and judged: why it must be asked again (`self.retry`), or None."""
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
                    elif judge is None and usable(text := "".join([*held, item.text])):
                        held = None
                        yield StreamDelta(text)
                    else:
                        held.append(item.text)
            finally:
                await _close(stream)
            if held is None:
                yield end
                return
            text = "".join(held)
            if judge is not None:
                verdict = judge(text)
                self.retry = verdict if number == 0 else self.retry
                last = number == len(attempts) - 1
                if verdict is None or (last and verdict.reason == "off_span"):
                    self.unsure = self._too_unlikely(end)
                    yield StreamDelta(self._unsure_line() if self.unsure else text)
                    yield end
                    return
        self.no_answer = True
        yield StreamDelta(no_answer_text(self._source_names()))
        yield end

    def _too_unlikely(self, end: StreamEnd) -> bool:
        """Whether the model wrote its answer line with a likelihood below the generator's floor."""
        floor = self.answerer.settings.completion_likelihood_floor or 0.0
        said = likelihood(end.logprobs)
        return said is not None and said < floor

    def _source_names(self) -> list[str]:
        return [str(c.candidate.metadata.get("source", "")) for c in self.packed.chunks]

    def _unsure_line(self) -> str:
        return unsure_text(self._source_names(), chinese=in_chinese(self.question))

    def _judge_line(self, text: str, prompt: str) -> Retry | None:
        """Why an answer line must be asked again: nothing usable, an echo of the question, or (spans on)
        words that are no span of a source; None: it stands."""
        if not usable(text):
            return Retry("blank", text)
        if echoes(text, self.question):
            return Retry("echo", text)
        if counts_up(text):
            return Retry("counting", text)
        if self._spans_apply() and not is_span(text, self._sources(prompt)):
            return Retry("off_span", text)
        return None

    def _spans_apply(self) -> bool:
        """Whether an answer line must be a span: spans on, and the question not Chinese (on 100 CMRC questions
        67 lines were no span, and as spans they scored F1 0.279 against 0.313 as written: the answers there
        are long, and a paraphrase shares characters with them where a wrong short span shares none)."""
        return self.answerer.settings.completion_spans == "retry" and not in_chinese(self.question)

    @staticmethod
    def _sources(prompt: str) -> list[str]:
        examples = EXAMPLES_ZH if prompt.startswith(EXAMPLES_ZH.text) else EXAMPLES
        return source_lines(prompt, examples.text)

    def _retry_line(self, llm: LLMBackend, prompt: str) -> AsyncIterator[StreamDelta | StreamEnd]:
        """The second attempt: spans of the sources only (or, spans off, any non-blank line); after an echo
        of the question or a line that counted, not starting as that one did."""
        retry = self.retry or Retry("blank", "")
        grammar = span_grammar(self._sources(prompt)) if self._spans_apply() else ANSWER_LINE_GRAMMAR
        avoid = retry.text if retry.reason in ("echo", "counting") else None
        return self._answer_line(llm, prompt, grammar=grammar, avoid=avoid)

    def _answer_line(
        self, llm: LLMBackend, prompt: str, grammar: str | None = None, avoid: str | None = None
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        """One completion attempt: its text without the leading blank, ended where it starts to loop;
        `avoid`: an earlier attempt's echo of the question, whose first token this one may not write."""
        line = _lstripped(self._complete(llm, prompt, grammar, avoid))
        return _until_loop(line, self.packed.used) if self.answerer.settings.completion_stop_loops else line

    async def _complete(
        self, llm: LLMBackend, prompt: str, grammar: str | None = None, avoid: str | None = None
    ) -> AsyncIterator[StreamDelta | StreamEnd]:
        assert self.query.max_tokens is not None and self.query.temperature is not None
        ban = await self.answerer.example_ban(prompt)
        if avoid:  # the first token either way the line may begin it ("Answer:" then " 1", or "1")
            firsts: set[int] = set()
            for form in (avoid, f" {avoid}"):
                if tokens := await llm.tokenize(form):
                    firsts.add(tokens[0])
            ban = [*ban, *([token, False] for token in sorted(firsts))]
        extra = (
            {"logprobs": 1}  # the model's likelihood of its answer (Done.likelihood)
            | ({"logit_bias": ban} if ban else {})
            | ({"grammar": grammar} if grammar else {})
        )
        stream = llm.stream_completion(
            prompt,
            max_tokens=self.query.max_tokens,
            temperature=self.query.temperature,
            stop=list(COMPLETION_STOP),
            extra=extra or None,
            affinity=self.affinity,
        )
        try:
            async for item in stream:
                yield item
        finally:
            await _close(stream)

    def _closing_events(self, end: StreamEnd) -> tuple[Citations, Done]:
        # Our own line (no answer, or the model's withheld) cites and claims nothing.
        text = "" if self.no_answer or self.unsure else "".join(self.text_parts)
        chunks = {c.source_id: c.text for c in self.packed.chunks}
        fixed_text = (CompletionStyle if self.packed.style == "completion" else ChatStyle).fixed_text
        citations, check, attribution = citations_event(
            text, chunks, self.hits, question=self.searched.text, fixed_text=fixed_text
        )
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
            retried=self.retried,  # its first attempt was asked again
            retry_reason=self.retry.reason if self.retried and self.retry else None,
            unsure=self.unsure,
            likelihood=None if self.no_answer else likelihood(end.logprobs),
        )
        return citations, done


class NoSourcesAnswer:
    """The fixed answer when no source is good enough: no model call, nothing cited, no generation slot."""

    def __init__(
        self,
        query: ChatQuery,
        clock: Clock,
        reason: NoSourcesReason,
        dropped: list[Dropped],
        packed: PackedPrompt | None = None,
        *,
        searched: SearchQuery,
        style: str,
        unknown_names: Sequence[str] = (),
    ) -> None:
        self.query = query
        self.clock = clock
        self.reason = reason
        self.unknown_names = list(unknown_names)  # why: `not_mentioned`
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
        text = no_sources_answer(self.query.collection, self.query.messages[-1]["content"], self.unknown_names)
        yield Sources(sources=[], query=self.searched.text, rewrite=self.searched.rewrite)
        yield self.budget_event()
        self.clock.mark("first_token")
        yield Token(text=text)
        yield Citations()
        yield NoSourcesDone(
            ttft_ms=self.clock.ms(None, "first_token"),
            no_sources=self.reason,
            retrieval_ms=self.clock.ms(None, "retrieved"),
            unknown_names=self.unknown_names or None,
        )


def likelihood(logprobs: list[float] | None) -> float | None:
    """The geometric mean of the probabilities whose logs are `logprobs` (None for none)."""
    return round(math.exp(sum(logprobs) / len(logprobs)), 4) if logprobs else None


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


async def _until_loop(
    stream: AsyncIterator[StreamDelta | StreamEnd], prompt_tokens: int
) -> AsyncIterator[StreamDelta | StreamEnd]:
    """The answer line up to where it starts repeating itself (rag.answering.repetition); generation is then
    stopped and the end says `repetition`, with the tokens generated until then."""
    guard, generated, end = LoopGuard(), 0, None
    try:
        async for item in stream:
            if isinstance(item, StreamEnd):
                end = item
                break
            generated += 1
            if text := guard.feed(item.text):
                yield StreamDelta(text)
            if guard.looped:
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated}
                end = StreamEnd("repetition", usage={**usage, "total_tokens": prompt_tokens + generated})
                break
    finally:
        await _close(stream)
    if rest := guard.rest():  # nothing after a loop
        yield StreamDelta(rest)
    if end is not None:
        yield end


async def _told(read: Read) -> AsyncIterator[StreamDelta | StreamEnd]:
    """An answer read from a source, not generated: its text, then an end that says where it was read."""
    yield StreamDelta(read.text)
    yield StreamEnd(read.where, usage={"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})


async def _until_sentences(
    stream: AsyncIterator[StreamDelta | StreamEnd], limit: int, prompt_tokens: int
) -> AsyncIterator[StreamDelta | StreamEnd]:
    """The chat answer up to the end of its `limit`-th sentence, or to a blank line after some text
    (0: all of it); generation is then stopped and the end says `stop`, with the tokens generated so far."""
    if limit <= 0:
        async for item in stream:
            yield item
        return
    text, shown, generated = "", 0, 0
    try:
        async for item in stream:
            if isinstance(item, StreamEnd):
                if rest := text[shown:]:
                    yield StreamDelta(rest)
                yield item
                return
            generated += 1
            text += item.text
            cut = _answer_end(text, limit)
            if cut is None:
                # Hold back a trailing end-mark and blanks: whether they close a sentence shows only later.
                safe = len(text.rstrip(".!?。！？；…\n \t\"')]”’"))
                if safe > shown:
                    yield StreamDelta(text[shown:safe])
                    shown = safe
                continue
            if cut > shown:
                yield StreamDelta(text[shown:cut])
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated}
            yield StreamEnd("stop", usage={**usage, "total_tokens": prompt_tokens + generated})
            return
    finally:
        await _close(stream)


def _answer_end(text: str, limit: int) -> int | None:
    """Where an answer of at most `limit` sentences ends in `text`: after its limit-th sentence end that
    more text has followed, or before a blank line after text; None: not yet."""
    stripped = text.lstrip()
    lead = len(text) - len(stripped)
    blank = stripped.find("\n\n")
    ends = [e for e in sentence_ends(stripped) if stripped[e:].strip()]
    candidates = [lead + blank] if blank > 0 else []
    if len(ends) >= limit:
        candidates.append(lead + ends[limit - 1])
    return min(candidates) if candidates else None


async def discard(task: asyncio.Future[Any]) -> None:
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
