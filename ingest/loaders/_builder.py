"""Assembles extracted blocks into one text and the sections that tile it (offsets computed once, here)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

import regex

from rag.core.errors import DocumentRejected

from ..models import DocKind, LoadedDocument, Section, TextBox

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ufeff\ufffe]")
# ANSI/VT escape sequences (terminal colours as in "\x1b[1mGNU\x1b[22m ROFF"): CSI with its parameters,
# OSC up to its terminator, and the two-character escapes; also their 8-bit CSI form.
_ANSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]")
# Something a reader sees, by Unicode category: a letter, number, punctuation or symbol (L, N, P, S), so
# not a space or separator (Z: NBSP, U+3000), a format or control character (C: zero-width spaces and
# joiners, bidi marks, the BOM, the soft hyphen, the tags U+E0020-E007F) nor a mark alone (M: combining
# accents, variation selectors); nor one of the letters and symbols that are blank by design: the Hangul
# fillers, the Braille blank and the ideographic half fill space. (The `regex` module knows the
# categories; `re` does not.)
_VISIBLE = regex.compile(r"[^\p{Z}\p{C}\p{M}\s\u115f\u1160\u3164\uffa0\u2800\u303f]")
# nroff's overstrike: bold "X\bX" and underline "_\bX" keep the last character.
_OVERSTRIKE = re.compile(r".\x08(?=.)", re.DOTALL)


# Characters cleaned at a time: `re` holds the GIL for a whole call, so a 48 MB text cleaned in one call
# would stop the API's event loop (/health, every stream) for a second or more.
_PIECE = 1 << 20


def clean(text: str) -> str:
    """Text with newlines normalised, terminal escapes and overstrikes undone, and control characters
    (but tabs, newlines, form feeds) removed. Idempotent: every loader's text goes through it."""
    text = _in_pieces(lambda piece: piece.replace("\r\n", "\n").replace("\r", "\n"), text)
    if "\x1b" in text or "\x9b" in text:
        text = _ANSI.sub("", text)
    if "\x08" in text:
        text = _OVERSTRIKE.sub("", text)
    return _in_pieces(lambda piece: _CONTROL.sub("", piece), text)


def _in_pieces(step: Callable[[str], str], text: str) -> str:
    """`step` applied to `text` a _PIECE at a time (other threads run in between); no "\r\n" is split."""
    if len(text) <= _PIECE:
        return step(text)
    pieces, start = [], 0
    while start < len(text):
        end = start + _PIECE
        end += text[end - 1 : end + 1] == "\r\n"
        pieces.append(step(text[start:end]))
        start = end
    return "".join(pieces)


class DocumentBuilder:
    """Collects headings and blocks in reading order; a section runs from one heading (or page) to the next.

    A heading with no body before the next heading does not make a section of its own: the section
    starts at the first heading and takes the deepest heading path, so "# A / ## B / text" is one
    section under ("A", "B") that still contains both heading lines.
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._length = 0
        self._path: list[tuple[int, str]] = []
        self._page: int | None = None
        self._start: int | None = None
        self._has_body = False
        self._boxes: list[TextBox] = []  # of the open section, in document offsets
        self._header_end: int | None = None
        self._spans: list[tuple[int, int, int | None, tuple[str, ...], tuple[TextBox, ...], int | None]] = []

    def heading(self, title: str, level: int, raw: str | None = None, sep: str = "\n\n") -> None:
        """A heading of `level` (smaller is higher); `raw` is the text to append if not the title itself."""
        title, raw = clean(title), None if raw is None else clean(raw)
        if self._has_body:
            self._close()
        while self._path and self._path[-1][0] >= level:
            self._path.pop()
        if title:
            self._path.append((level, title))
        self._mark(self._append(title if raw is None else raw, sep))

    def block(self, text: str, sep: str = "\n\n", boxes: Sequence[TextBox] = ()) -> None:
        """A run of body text; `sep` joins it to what came before. `boxes` place it on its page, with
        offsets into `text` (which must then be clean already: `clean` would move them)."""
        cleaned = clean(text)
        if boxes and cleaned != text:
            raise ValueError("a block with boxes must be clean text (offsets would move)")
        if not cleaned:
            return
        start = self._append(cleaned, sep)
        if cleaned.strip():
            self._mark(start)
            self._has_body = True
            self._boxes.extend(replace(b, start=b.start + start, end=b.end + start) for b in boxes)

    def table(self, text: str, header: str, boxes: Sequence[TextBox] = ()) -> None:
        """A table as a section of its own: `text` is clean markdown starting with `header` (its caption
        and header row: see `ingest.loaders.tables`), `boxes` as in `block`."""
        if clean(text) != text:
            raise ValueError("a table's markdown must be clean text")
        if self._has_body:
            self._close()
        if not text.strip():
            return
        self.block(text, boxes=boxes)
        # Heading lines just before the table open its section: they are part of what each chunk repeats.
        self._header_end = self._length - len(text) + len(header) if text.startswith(header) and header else None
        self._close()

    def page(self, number: int) -> None:
        """Start page `number` (1-based): no section crosses a page boundary."""
        self._close()
        self._page = number

    def build(self, name: str, kind: DocKind, **fields: object) -> LoadedDocument:
        """The document, or DocumentRejected when nothing but whitespace was extracted."""
        self._close()
        text = "".join(self._parts)
        sections = tuple(s for s in (self._section(text, *span) for span in self._spans) if _VISIBLE.search(s.text))
        if not sections:
            raise DocumentRejected(
                f"{name} has no text to index (it is empty, or whitespace and invisible characters only)"
            )
        return LoadedDocument(name=name, kind=kind, text=text, sections=sections, **fields)  # type: ignore[arg-type]

    def _append(self, text: str, sep: str) -> int:
        if self._length and sep:
            self._parts.append(sep)
            self._length += len(sep)
        start = self._length
        self._parts.append(text)
        self._length += len(text)
        return start

    def _mark(self, start: int) -> None:
        if self._start is None:
            self._start = start

    def _close(self) -> None:
        if self._start is not None:
            headings = tuple(title for _, title in self._path)
            self._spans.append((self._start, self._length, self._page, headings, tuple(self._boxes), self._header_end))
        self._start = None
        self._has_body = False
        self._boxes = []
        self._header_end = None

    @staticmethod
    def _section(
        text: str,
        start: int,
        end: int,
        page: int | None,
        headings: tuple[str, ...],
        boxes: tuple[TextBox, ...],
        header_end: int | None,
    ) -> Section:
        span = text[start:end]
        stripped = span.lstrip()
        start += len(span) - len(stripped)
        stripped = stripped.rstrip()
        end = start + len(stripped)
        table_header = text[start:header_end] if header_end is not None and start < header_end <= end else ""
        boxes = tuple(b for b in boxes if b.start < end and b.end > start)
        return Section(
            text=stripped, start=start, end=end, page=page, headings=headings, boxes=boxes, table_header=table_header
        )
