"""Our sources as OpenAI's `url_citation` annotations: what OpenAI-style clients (Open WebUI, the SDKs)
show as citations, each a link that opens the cited chunk in our page's viewer.

OpenAI's chat completions carry web-search citations as `message.annotations` (whole responses) and
`delta.annotations` (streams): `{"type": "url_citation", "url_citation": {"url", "title", "start_index",
"end_index"}}`, the indexes being the span of the answer text the source backs. An attributed source
spans the sentences it supports; a model's own [Sn] citation, or a source no sentence names, spans the
whole answer. Notes come as annotations too, linking to our page, so that a client shows them where it
shows sources: a cut answer (the token limit), and a client's system message left out (the completion
prompt style of a base model has no place for it) or cut to its share of the prompt budget.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlencode

from pydantic import BaseModel

from rag.answering.events import Citations, SourceEntry

CUT_NOTE = "The answer was cut at the token limit (finish_reason: length); ask for more max_tokens."
# What became of a client's system message, and the note each shows (none for "none" and "passed").
SystemMessage = Literal["none", "passed", "cut", "too_long", "base_model"]
SYSTEM_NOTES: dict[SystemMessage, str] = {
    "cut": "Your client's system message was cut to its first sentences (RAG_CLIENT_SYSTEM_TOKENS).",
    "too_long": "Your client's system message was left out: its first sentence is over RAG_CLIENT_SYSTEM_TOKENS.",
    "base_model": "Your client's system message was left out: this base model's prompt (the completion style) "
    "follows fixed examples, not instructions.",
}


class UrlCitation(BaseModel):
    url: str
    title: str
    start_index: int
    end_index: int


class Annotation(BaseModel):
    type: Literal["url_citation"] = "url_citation"
    url_citation: UrlCitation


def viewer_url(base_url: str, source: SourceEntry, collection: str | None) -> str:
    """The page's address that opens SOURCE in the viewer (`/?doc=...&chunk=...`, read by chat.js)."""
    index = source.chunk_id.rsplit(":", 1)[-1]
    query = {"doc": source.doc_id, "chunk": index, "source": source.source, "cite": source.id}
    if collection:
        query["collection"] = collection
    return f"{base_url.rstrip('/')}/?{urlencode(query)}"


def _title(source: SourceEntry) -> str:
    page = f", page {source.page}" if source.page not in (None, "") else ""
    return f"[{source.id}] {source.source}{page}"


def url_citations(
    text: str,
    sources: list[SourceEntry],
    citations: Citations | None,
    *,
    base_url: str,
    collection: str | None,
    cut: bool = False,
    system: SystemMessage = "none",
) -> list[Annotation]:
    """The annotations of one answer: each cited source once, in the order the citations name them."""
    by_id = {source.id: source for source in sources}
    spans: dict[str, tuple[int, int]] = {}
    for entry in citations.citations if citations else []:
        source = by_id.get(entry.id)
        if source is None:
            continue
        start, end = 0, len(text)
        if entry.kind == "attributed" and entry.sentences and citations is not None:
            chosen = [citations.sentences[i] for i in entry.sentences if 0 <= i < len(citations.sentences)]
            if chosen:
                start, end = min(s.start for s in chosen), max(s.end for s in chosen)
        known = spans.get(entry.id)
        spans[entry.id] = (min(start, known[0]), max(end, known[1])) if known else (start, end)
    found = [
        Annotation(
            url_citation=UrlCitation(
                url=viewer_url(base_url, by_id[sid], collection), title=_title(by_id[sid]), start_index=s, end_index=e
            )
        )
        for sid, (s, e) in spans.items()
    ]
    notes = [CUT_NOTE] if cut else []
    notes += [SYSTEM_NOTES[system]] if system in SYSTEM_NOTES else []
    for note in notes:
        at_end = UrlCitation(url=f"{base_url.rstrip('/')}/", title=note, start_index=len(text), end_index=len(text))
        found.append(Annotation(url_citation=at_end))
    return found
