"""The data that flows through ingestion: a loaded document, its sections, and the chunks cut from it.

Offsets are character offsets into `LoadedDocument.text` (the extracted text, not the file's bytes):
`doc.text[s.start:s.end] == s.text` for every section and `doc.text[c.start:c.end] == c.text` for
every chunk, but for the chunks of a long table: each after the first starts with the table's caption
and header row (`Section.table_header`) before its rows, so `c.text == c.lead + doc.text[c.start:c.end]`.
Sections never span two PDF pages, so neither do chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum


class DocKind(str, Enum):
    """The formats we load; the value is what metadata and messages show."""

    TEXT = "text"
    MARKDOWN = "markdown"
    HTML = "html"
    PDF = "pdf"
    DOCX = "docx"
    IMAGE = "image"
    MAN = "man"  # a man page's troff source


@dataclass(frozen=True, slots=True)
class TextBox:
    """Where a run of the extracted text sits on its page, for showing a cited passage on the page.

    `start`/`end` are offsets into `LoadedDocument.text` (like a section's); the box is in fractions of
    the page's width and height with the origin at the top left, so a page rendered at any size can draw
    it. `confidence` is the OCR's score of the line, None for text from a PDF's text layer.
    """

    start: int
    end: int
    x0: float
    y0: float
    x1: float
    y1: float
    confidence: float | None = None


@dataclass(frozen=True, slots=True)
class Section:
    """A run of the extracted text under one heading path on one page (PDF) or in one place (others)."""

    text: str
    start: int
    end: int
    page: int | None = None
    headings: tuple[str, ...] = ()
    boxes: tuple[TextBox, ...] = ()
    # A table's section: its caption and header row (markdown), the start of `text`, repeated by every chunk.
    table_header: str = ""


@dataclass(frozen=True, slots=True)
class LoadedDocument:
    """What a loader extracted from one file: the full text and the sections that tile its content."""

    name: str
    kind: DocKind
    text: str
    sections: tuple[Section, ...]
    title: str | None = None
    pages: int | None = None
    encoding: str | None = None
    warnings: tuple[str, ...] = ()  # what was left out and why (an OCR page that ran past its time)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a document, small enough for the embedder, with where it came from."""

    doc_id: str
    index: int
    source: str
    text: str
    start: int
    end: int
    n_tokens: int
    page: int | None = None
    headings: tuple[str, ...] = ()
    boxes: tuple[TextBox, ...] = ()
    lead: str = ""  # the table header repeated before the rows; `text` starts with it

    @property
    def id(self) -> str:
        return f"{self.doc_id}:{self.index}"

    def metadata(self) -> dict[str, str | int]:
        """Flat metadata for a vector store (scalars only, no None values)."""
        meta: dict[str, str | int] = {
            "doc_id": self.doc_id,
            "index": self.index,
            "source": self.source,
            "start": self.start,
            "end": self.end,
            "n_tokens": self.n_tokens,
        }
        if self.page is not None:
            meta["page"] = self.page
        if self.headings:
            meta["headings"] = " > ".join(self.headings)
        if self.boxes:
            meta["boxes"] = encode_boxes(self.boxes)
        if self.lead:
            meta["lead"] = len(self.lead)
        return meta


MAX_CHUNK_BOXES = 64


def encode_boxes(boxes: tuple[TextBox, ...] | list[TextBox]) -> str:
    """A chunk's boxes as compact JSON for scalar-only metadata: `[[x0, y0, x1, y1(, confidence)], ...]`
    in fractions of the page, 4 decimals (a tenth of a point on a Letter page). More than
    `MAX_CHUNK_BOXES` are merged neighbour by neighbour, so the string stays a few KB at most."""
    rects = [[b.x0, b.y0, b.x1, b.y1] + ([b.confidence] if b.confidence is not None else []) for b in boxes]
    while len(rects) > MAX_CHUNK_BOXES:
        rects = [_union(rects[i : i + 2]) for i in range(0, len(rects), 2)]
    return json.dumps([[round(v, 4) for v in r] for r in rects], separators=(",", ":"))


def decode_boxes(value: object) -> list[list[float]]:
    """The boxes `encode_boxes` wrote ([] for a missing or unreadable value)."""
    if not isinstance(value, str) or not value:
        return []
    try:
        rects = json.loads(value)
    except ValueError:
        return []
    return [r for r in rects if isinstance(r, list) and len(r) in (4, 5)]


def _union(rects: list[list[float]]) -> list[float]:
    merged = [min(r[0] for r in rects), min(r[1] for r in rects), max(r[2] for r in rects), max(r[3] for r in rects)]
    scores = [r[4] for r in rects if len(r) == 5]
    return merged + ([min(scores)] if scores else [])
