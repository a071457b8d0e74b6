"""The data that flows through ingestion: a loaded document, its sections, and the chunks cut from it.

Offsets are character offsets into `LoadedDocument.text` (the extracted text, not the file's bytes):
`doc.text[s.start:s.end] == s.text` for every section and `doc.text[c.start:c.end] == c.text` for
every chunk. Sections never span two PDF pages, so neither do chunks.
"""

from __future__ import annotations

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
        return meta
