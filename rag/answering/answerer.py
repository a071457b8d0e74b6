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

No good sources (empty collection, nothing retrieved at or above min_score, the hits judged not to
cover the question by rag.answering.coverage_rule -- `not_relevant` --, or no chunk fits): the model is not called. A fixed answer says that the documents do not cover the question and cites
nothing. A small model asked to answer "from no sources" still invents; a fixed reply cannot, costs
no generation slot, and reads the same in every language of the UI.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rag.answering.answer_stream import Answer, NoSourcesAnswer, Read, discard
from rag.answering.budget import Candidate, PackedPrompt, PromptBudget
from rag.answering.continuation import Sent, SentSources, questions_so_far_key, user_turns
from rag.answering.counts import stated_count
from rag.answering.coverage_rule import covered, unknown_names
from rag.answering.definitions import asks_for_entry, first_answering, named_documents, named_entry
from rag.answering.ellipsis import whole_question
from rag.answering.events import (
    Dropped,
    NoSourcesReason,
)
from rag.answering.focus import named_cell
from rag.answering.followup import SearchQuery, search_query
from rag.answering.gate import GenerationGate, Permit
from rag.answering.prompt import (
    EXAMPLES,
    EXAMPLES_ZH,
    ChatStyle,
    CompletionStyle,
    Message,
    PromptStyle,
    choose_style,
)
from rag.answering.query import ChatQuery, Clock, Hit, Searcher, cut_off, split_question
from rag.answering.shared_gate import SharedGenerationGate
from rag.answering.shared_sent import SharedSentSources
from rag.clients.backends import LLMBackend
from rag.clients.llm import ServerProps
from rag.core.config import Settings
from rag.core.errors import BackendUnavailable, LLMUnavailable, UpstreamError

log = logging.getLogger(__name__)

PROPS_TTL_S = 30.0
DOCUMENT_K = 50  # chunks of a named document searched for the option a question names (a man page holds 10-40)

__all__ = ["Answer", "Answerer", "ChatQuery", "NoSourcesAnswer", "cut_off", "split_question"]


class Answerer:
    """Answers questions against one llama-server and one retriever."""

    def __init__(self, llm: LLMBackend, searcher: Searcher, settings: Settings) -> None:
        self.llm = llm
        self.searcher = searcher
        self.settings = settings
        self.budget = PromptBudget(llm)
        self.gate = (
            SharedGenerationGate(settings.database_url, 1, settings.queue_max, settings.queue_timeout_s)
            if settings.database_url
            else GenerationGate(1, settings.queue_max, settings.queue_timeout_s)
        )
        self._props: ServerProps | None = None
        self._props_at = 0.0
        self.style_choice = choose_style(settings.llm_prompt_style, [settings.llm_model_path])
        self._example_tokens: dict[str, set[int]] = {}  # per language of the examples
        # What each conversation's last prompt sent, so a follow-up extends it (every replica's, on PostgreSQL).
        self.sent = SharedSentSources(settings.database_url) if settings.database_url else SentSources()

    async def example_ban(self, prompt: str) -> list[list[int | bool]]:
        """llama-server `logit_bias` entries that forbid the example answers' tokens absent from the
        prompt's own part (sources, history, question): a copied example answer cannot be generated."""
        examples = EXAMPLES_ZH if prompt.startswith(EXAMPLES_ZH.text) else EXAMPLES
        if examples.language not in self._example_tokens:
            tokens: set[int] = set()
            for answer in examples.answers:
                tokens.update(await self.llm.tokenize(f" {answer}"))
            self._example_tokens[examples.language] = tokens
        own = set(await self.llm.tokenize(prompt.removeprefix(examples.text)))
        return [[token, False] for token in sorted(self._example_tokens[examples.language] - own)]

    @property
    def style(self) -> PromptStyle:
        """How prompts are written for the served model (rag.answering.prompt)."""
        s = self.settings
        if self.style_choice.name == "completion":
            return CompletionStyle(
                s.completion_max_sources, extra_sources=s.completion_extra_sources, focus=s.completion_focus
            )
        return ChatStyle(s.chat_max_sources, s.chat_extra_sources)

    def style_for(
        self, question: str, history: Sequence[Message] = (), searched: SearchQuery | None = None
    ) -> PromptStyle:
        """The style for one question: a completion prompt takes its examples in the question's script.

        Which question its sources are focused on: in the chat style, the conversation's first one, so a
        follow-up's prompt renders the sources it shares with the previous prompt alike and extends it
        (llama-server reuses the prefix), a new subject (`ellipsis`) its own. In the completion style a
        follow-up is asked alone (`asks_alone`) and focused on its own words, which point at the part of
        the sources it asks about (the previous question's words found the document): the question as
        asked, the whole question of a new subject, or the generator's standalone question."""
        style = self.style
        if style.name == "completion":
            whole = searched.text if searched is not None and searched.rewrite in ("ellipsis", "generator") else None
            return style.for_question(question, whole)
        new_subject = searched is not None and searched.rewrite == "ellipsis"
        first = None if new_subject else next((m["content"] for m in history if m["role"] == "user"), None)
        return style.for_question(question, first)

    def asks_alone(self, searched: SearchQuery) -> bool:
        """Whether a follow-up's prompt is built as a first question's: its own sources in rank order (not
        the previous prompt's first) and, in the completion style, no earlier turns. A base model shown the
        turn before copies its answer ("And which one is sent to request termination?" -> "SIGINT" again:
        6 of the 11 wrong follow-ups of bench/real_docs); the conversation reaches it through retrieval
        (rag.answering.followup) and the whole question (rag.answering.ellipsis) instead. A new subject
        (`ellipsis`) is asked alone in either style: the previous prompt's sources are about the old one."""
        return self.style_choice.name == "completion" or searched.rewrite == "ellipsis"

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
        await self.budget.warm(question, history=history, style=self.style_for(question))
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
        clock = Clock()
        asked, query = query, self.with_defaults(query)
        history, question = split_question(query.messages)
        asked_question = question
        if self.settings.followup_rewrite != "off":
            question = whole_question(history, question)  # "And pop3s?" asked as the previous question about it
        # llama-server's numbers and the question's token count are fetched while retrieval runs.
        ahead = asyncio.ensure_future(self._look_ahead(question, bool(history)))
        try:
            if question != asked_question:  # a new subject: the previous question's words would find the old one
                searched = SearchQuery(question, "ellipsis")
            else:
                searched = await search_query(self.settings.followup_rewrite, history, question, self.llm)
            hits = list(
                await self.searcher.search(
                    searched.text, collection=query.collection, k=query.top_k, doc_ids=query.doc_ids
                )
            )
        except BaseException:
            await discard(ahead)
            raise
        clock.mark("retrieved")
        good = [h for h in hits if h.score >= self.settings.min_score]
        below = [
            Dropped(chunk_id=h.chunk_id, reason="below_min_score") for h in hits if h.score < self.settings.min_score
        ]
        reason: NoSourcesReason = "no_match" if hits else "nothing_retrieved"
        unknown: tuple[str, ...] = ()
        if good and not covered(searched.text, good, self.settings):
            unknown = unknown_names(good, self.settings)
            reason, good = ("not_mentioned" if unknown else "not_relevant"), []
            below = [Dropped(chunk_id=h.chunk_id, reason="below_min_relevance") for h in hits]
        good, far = cut_off(good, self.settings.pack_relative_score)
        said = " ".join([*(m["content"] for m in history if m["role"] == "user"), searched.text])
        good, far = await self._naming_entry_first(good, far, question, query, said)
        below += [Dropped(chunk_id=h.chunk_id, reason="far_below_best") for h in far]
        if not good:
            await self._question_fits(ahead, query, question)
            return NoSourcesAnswer(
                query, clock, reason, below, searched=searched, style=self.style.name, unknown_names=unknown
            )
        props = await ahead
        query = self.with_defaults(asked)  # the style may be known only now, from llama-server's model path
        turns = user_turns(query.messages)
        alone = self.asks_alone(searched)
        before = questions_so_far_key(query.collection, query.doc_ids, turns[:-1]) if history and not alone else None
        ordered = await self.sent.recall(before, good)  # a follow-up's sources start as its previous prompt's did
        by_id = {f"S{i}": hit for i, hit in enumerate(ordered.hits, 1)}
        candidates = [
            Candidate(sid, h.chunk_id, text, h.metadata, h.coverage)
            for (sid, h), text in zip(by_id.items(), ordered.texts)
        ]
        packed = await self.pack(query, history, question, candidates, props.n_ctx, searched=searched)
        await self.sent.keep(
            questions_so_far_key(query.collection, query.doc_ids, turns),
            [Sent(c.candidate.chunk_id, _cut_chars(c.text, by_id[c.source_id].text)) for c in packed.chunks],
        )
        packed.dropped += below
        clock.mark("packed")
        if not packed.chunks:
            return NoSourcesAnswer(
                query, clock, "no_room", packed.dropped, packed, searched=searched, style=packed.style
            )
        read = self._read(packed, question, candidates)
        # An answer read from a source generates nothing: it waits for no generation slot.
        permit = Permit(None, 0.0) if read is not None else await self.gate.acquire()
        clock.mark("admitted")
        return Answer(
            self, query, history, question, candidates, by_id, packed, permit, clock, searched=searched, read=read
        )

    async def _naming_entry_first(
        self, kept: list[Hit], cut: list[Hit], question: str, query: ChatQuery, said: str = ""
    ) -> tuple[list[Hit], list[Hit]]:
        """The hits with the first one whose definition list holds the option the question names ("ls 的
        -t 选项做什么？"), or the entry that answers "which option…" (`first_answering`), in front, taken
        back from those cut off when it is there, else searched for in the document the question names
        (`named_documents`): the lexical index drops one-letter words, a dense embedding tells -t from -T
        poorly, and a man page's options span many chunks. Only a document the question names, when it
        names one, or the conversation `said` before it or searched for it does (a follow-up's: "Which
        option gives the best compression?" after a question about gzip)."""
        if not asks_for_entry(question):
            return _keyed_row_first(kept, cut, question)
        hits = [*kept, *cut]
        named = named_documents(f"{said} {question}", (_source(h.metadata) for h in hits))
        texts = [h.text if not named or _source(h.metadata) in named else "" for h in hits]
        first = first_answering(texts, question)
        if first == 0:
            return kept, cut
        if first is not None:
            return _put_first(hits[first], kept, cut)
        doc_ids = {h.doc_id for h in hits if _source(h.metadata) in named}
        if not doc_ids:
            return kept, cut
        found = await self.searcher.search(question, collection=query.collection, k=DOCUMENT_K, doc_ids=doc_ids)
        more = [h for h in found if h.doc_id in doc_ids]
        first = first_answering([h.text for h in more], question)
        return _put_first(more[first], kept, cut) if first is not None else (kept, cut)

    def _read(self, packed: PackedPrompt, question: str, candidates: Sequence[Candidate]) -> Read | None:
        """The cell of the first source's table at the row and column the question names
        (rag.answering.focus.named_cell), or the entry of its definition list that the question names or
        asks for (rag.answering.definitions.named_entry), in the completion style: read, not generated."""
        if packed.style != "completion" or self.settings.completion_focus == "off" or not packed.chunks:
            return None
        text = packed.chunks[0].text
        if (cell := named_cell(text, question)) is not None:
            return Read(cell, "table_cell")
        if (count := stated_count(text, question)) is not None:
            return Read(count, "stated_count")
        named = named_documents(question, (_source(c.metadata) for c in candidates))
        if named and _source(packed.chunks[0].candidate.metadata) not in named:
            return None  # a list of another document than the one the question names
        if (entry := named_entry(text, question)) is not None:
            return Read(entry, "list_entry")
        return None

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
        *,
        searched: SearchQuery | None = None,
    ) -> PackedPrompt:
        """The query's prompt packed for a context of `n_ctx` (less `correction` tokens), its sources
        focused as `style_for` says; a follow-up asked alone (`asks_alone`) in the completion style is
        packed without the earlier turns."""
        assert query.max_tokens is not None  # with_defaults filled it in
        style = self.style_for(question, history, searched)
        if style.name == "completion":
            history = []  # asked alone (`asks_alone`)
        return await self.budget.pack(
            question=question,
            candidates=candidates,
            history=history,
            n_ctx=n_ctx,
            reserve=query.max_tokens,
            ceiling=self.settings.context_budget,
            correction=correction,
            history_share=self.settings.history_share,
            followup_room=self.settings.followup_room,
            style=style.with_instructions(query.system or ""),
            instructions_limit=self.settings.client_system_tokens,
        )


def _keyed_row_first(kept: list[Hit], cut: list[Hit], question: str) -> tuple[list[Hit], list[Hit]]:
    """The hits with the first one whose table has a cell at a row keyed by the question's own words and
    the column it names (rag.answering.focus.named_cell) in front, when the first has none: a table split
    over chunks repeats its header in each, and the chunk of /etc/services ranked first for "What aliases
    does the kerberos service have?" may hold the rows around it but not its own."""
    hits = [*kept, *cut]
    if not hits or named_cell(hits[0].text, question) is not None:
        return kept, cut
    picked = next((h for h in hits if named_cell(h.text, question, keyed_only=True) is not None), None)
    return _put_first(picked, kept, cut) if picked is not None else (kept, cut)


def _put_first(picked: Hit, kept: list[Hit], cut: list[Hit]) -> tuple[list[Hit], list[Hit]]:
    """`picked` first among the hits kept, out of those cut off (it may be one of either, or neither: a hit
    of a search of its own, compared by chunk id)."""
    return [picked, *(h for h in kept if h.chunk_id != picked.chunk_id)], [
        h for h in cut if h.chunk_id != picked.chunk_id
    ]


def _source(metadata: Mapping[str, Any]) -> str:
    return str(metadata.get("source", ""))


def _cut_chars(sent: str, whole: str) -> int | None:
    """The length of a source's text as sent, when that is less than its whole chunk (cut at a sentence)."""
    return len(sent) if len(sent) < len(whole.strip()) else None
