"""The typed events of an answer: what `Answer.events()` yields and what every caller sends on.

    Sources     the sources in the prompt, with the query that retrieval searched
    Budget      how the prompt was packed into the context
    Token       a piece of the answer's text
    Citations   the model's checked [Sn] ids and the sources attributed to each answer sentence
    Done        the usage and timings of a generated answer (NoSourcesDone: the fixed answer's)

Each event is a pydantic model whose `name` is its SSE event name and whose JSON is its SSE data; the
routes (`/v1/chat` in both modes, `/v1/chat/completions`) and `rag eval` read these models, so the
payloads are built once here and the OpenAPI schema describes them. Fields that the API sends only
when they hold something (a source's page, an attributed citation's sentences) are left out when None.
`AnswerDocument.collect` turns the events into the one document of a `"stream": false` answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field
from typing_extensions import TypedDict

DropReason = Literal["below_min_score", "below_min_relevance", "far_below_best", "budget", "style_limit"]
NoSourcesReason = Literal["nothing_retrieved", "no_match", "not_relevant", "not_mentioned", "no_room"]


def _omitted_when_none(value: object) -> bool:
    return value is None


# A field that the API sends only when it holds something.
Page = Annotated[int | str | None, Field(default=None, exclude_if=_omitted_when_none)]
Heading = Annotated[str | None, Field(default=None, exclude_if=_omitted_when_none)]


class Dropped(TypedDict):
    """A retrieved chunk left out of the prompt, and why."""

    chunk_id: str
    reason: DropReason


class Event(BaseModel):
    """One event of an answer; `name` is its SSE event name, its JSON the event's data."""

    name: ClassVar[str]

    @property
    def data(self) -> dict[str, Any]:
        """The event's data as the API sends it."""
        return self.model_dump(mode="json")


class SourceEntry(BaseModel):
    """A source as the API shows it."""

    id: str
    chunk_id: str
    doc_id: str
    source: str
    text: str
    snippet: str
    score: float
    page: Page
    heading: Heading
    # OCR lines of the chunk read in doubt (a chunk of OCR text only)
    ocr_low_confidence: Annotated[int | None, Field(default=None, exclude_if=_omitted_when_none)]


class Search(BaseModel):
    """The query retrieval searched, and how a follow-up was rewritten (`off`: the question itself)."""

    query: str
    rewrite: str = "off"


class Sources(Event):
    name: ClassVar[str] = "sources"

    sources: list[SourceEntry]
    query: str
    rewrite: str

    @property
    def search(self) -> Search:
        return Search(query=self.query, rewrite=self.rewrite)


class BudgetChunk(BaseModel):
    id: str
    chunk_id: str
    tokens: int
    cut: bool


class Budget(Event):
    """How the prompt was packed; with no prompt built (no sources), the context numbers are None."""

    name: ClassVar[str] = "budget"

    n_ctx: int | None = None
    reserve: int | None = None
    limit: int | None = None
    used: int = 0
    system: int = 0
    history: int = 0
    question: int = 0
    chunks: list[BudgetChunk] = Field(default_factory=list)
    dropped: list[Dropped] = Field(default_factory=list)
    dropped_turns: int = 0
    kept_turns: int = 0
    latest_turn_reserved: int = 0
    followup_room_held: int = 0
    rounds: int = 0
    repacked: bool = False
    style: str = "chat"
    client_system: int = 0  # tokens of the client's system message in the prompt (0: none, or left out)
    client_system_cut: bool = False  # cut at a sentence end (or left out) to RAG_CLIENT_SYSTEM_TOKENS


class Token(Event):
    name: ClassVar[str] = "token"

    text: str


class CitationEntry(BaseModel):
    """A cited source: the model's own valid [Sn] (`model`) or one attributed to answer sentences."""

    id: str
    chunk_id: str
    doc_id: str
    source: str
    page: Page
    kind: Literal["model", "attributed"]
    support: float | None
    sentences: Annotated[list[int] | None, Field(default=None, exclude_if=_omitted_when_none)]  # attributed only


class SentenceEntry(BaseModel):
    text: str
    start: int
    end: int
    support: float
    sources: list[str]
    supported: bool


class Citations(Event):
    name: ClassVar[str] = "citations"

    citations: list[CitationEntry] = Field(default_factory=list)
    invalid: list[str] = Field(default_factory=list)
    echoed: list[str] = Field(default_factory=list)
    sentences: list[SentenceEntry] = Field(default_factory=list)


class Done(Event):
    """The end of a generated answer. `usage` and `timings` are llama-server's own, passed through."""

    name: ClassVar[str] = "done"

    usage: dict[str, Any]
    timings: dict[str, Any]
    ttft_ms: float | None
    invalid_citations: int
    cache_n: int | None
    # llama-server's ("stop", "length"), or "repetition": we ended a looping line; "table_cell": the answer is
    # the cell of the first source's table at the row and column the question names, read without the model;
    # "list_entry": the meaning of the first source's list entry the question names, or the term of the one
    # it asks for (rag.answering.definitions), read without the model; "stated_count": the count a sentence
    # of the first source states of what "how many…" asks for (rag.answering.counts), read without the model
    finish_reason: str | None
    retrieval_ms: float
    pack_ms: float
    queue_ms: float
    upstream_ttft_ms: float | None
    style: str
    unsupported_sentences: int
    no_answer: bool = False  # the model gave nothing usable: the answer is our fixed line naming the sources
    retried: bool = False  # the first attempt was asked once more: `retry_reason` says why
    # `blank` (nothing usable), `echo` (it only repeated the question), `counting` (it only counted: "1, 2,
    # 3, 4, …"), `off_span` (no span of a source)
    retry_reason: str | None = None
    # The model wrote a line, but below the generator's likelihood floor: it is withheld, and the answer is
    # our fixed line saying the sources do not answer clearly (rag.answering.no_answer).
    unsure: bool = False
    # The model's likelihood of the answer line it wrote: the geometric mean of its tokens' probabilities
    # (the completion style; None for a chat answer, a read one or our fixed line).
    likelihood: float | None = None


class NoSourcesDone(Event):
    """The end of the fixed answer given when no source is good enough (no model call)."""

    name: ClassVar[str] = "done"

    usage: dict[str, int] = Field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    timings: dict[str, Any] = Field(default_factory=dict)
    ttft_ms: float
    invalid_citations: int = 0
    cache_n: None = None
    finish_reason: Literal["no_sources"] = "no_sources"
    no_sources: NoSourcesReason
    retrieval_ms: float
    # `not_mentioned`: the question's names that no document holds a word of (rag.answering.named_terms).
    unknown_names: Annotated[list[str] | None, Field(default=None, exclude_if=_omitted_when_none)]


AnswerEvent = Sources | Budget | Token | Citations | Done | NoSourcesDone


class AnswerDocument(BaseModel):
    """A whole answer as one document (`/v1/chat` with `"stream": false`): the last of each event."""

    answer: str
    sources: list[SourceEntry]
    search: Search
    budget: Budget
    citations: Citations
    done: Done | NoSourcesDone

    @classmethod
    async def collect(cls, events: AsyncIterable[Event]) -> AnswerDocument:
        """Read an answer's events to the end (a repacked prompt sends sources and budget again)."""
        collected = Collected()
        async for event in events:
            collected.absorb(event)
        return collected.document()


class Collected:
    """The events of one answer so far: its text and the last event of each kind."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.sources: Sources | None = None
        self.budget: Budget | None = None
        self.citations: Citations | None = None
        self.done: Done | NoSourcesDone | None = None

    def absorb(self, event: Event) -> str | None:
        """Keep an event; return its text when it is a token."""
        if isinstance(event, Token):
            self.parts.append(event.text)
            return event.text
        if isinstance(event, Sources):
            self.sources = event
        elif isinstance(event, Budget):
            self.budget = event
        elif isinstance(event, Citations):
            self.citations = event
        elif isinstance(event, Done | NoSourcesDone):
            self.done = event
        return None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def document(self) -> AnswerDocument:
        """The answer as one document; every event must have come."""
        assert self.sources and self.budget and self.citations and self.done, "the answer has not ended"
        return AnswerDocument(
            answer=self.text,
            sources=self.sources.sources,
            search=self.sources.search,
            budget=self.budget,
            citations=self.citations,
            done=self.done,
        )
