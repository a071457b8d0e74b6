"""Tables as markdown: one shape for the tables of every format (PDF, DOCX, HTML, OCR).

    md = markdown_table(rows, caption="Table 2: Prices")
    builder.table(md.text, md.header, boxes=...)

The first row is the header. The text is the caption line (if any), the header row, the markdown
separator and one line per data row, so `md.text[:len(md.header)]` is what a chunk of later rows
repeats (see `ingest.chunking`): a chunk of rows 40-60 still names its columns.

`grid` places OCR line boxes in the columns they line up in (a scanned table: see `ingest.loaders.ocr`),
and `TableCarry` gives a table that goes on over a page without its header row the previous one (the
loaders turn its page at each page: a page without a table ends the carry).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ._builder import clean

_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class MarkdownTable:
    """A table in markdown; `header` (caption, header row, separator) is a prefix of `text`.

    `row_spans` are the (start, end) offsets in `text` of each row line, the header row first,
    `cell_spans` those of each cell of each row line, and `rows` the index in the input of the row each
    line shows (empty rows are dropped).
    """

    text: str
    header: str
    row_spans: tuple[tuple[int, int], ...]
    rows: tuple[int, ...]
    cell_spans: tuple[tuple[tuple[int, int], ...], ...] = ()


def cell_text(value: object) -> str:
    """A cell on one markdown line: whitespace collapsed, pipes escaped."""
    return _SPACE.sub(" ", clean("" if value is None else str(value))).strip().replace("|", "\\|")


def markdown_table(rows: Sequence[Sequence[object]], caption: str | None = None) -> MarkdownTable | None:
    """The rows (the first is the header) as a markdown table; None when no cell holds text.

    Empty rows are dropped and short rows padded, so every line has the header's columns.
    """
    indexed = [(i, [cell_text(c) for c in row]) for i, row in enumerate(rows)]
    indexed = [(i, row) for i, row in indexed if any(row)]
    cells = [row for _, row in indexed]
    if not cells:
        return None
    width = max(len(row) for row in cells)
    cells = [row + [""] * (width - len(row)) for row in cells]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    parts: list[str] = []
    caption = _SPACE.sub(" ", clean(caption or "")).strip()
    if caption:
        parts.append(caption)
    spans: list[tuple[int, int]] = []
    cell_spans: list[tuple[tuple[int, int], ...]] = []
    offset = len(caption) + 1 if caption else 0
    separator = "| " + " | ".join(["---"] * width) + " |"
    for i, (row, line) in enumerate(zip(cells, lines, strict=True)):
        spans.append((offset, offset + len(line)))
        starts = [offset + 2 + sum(len(c) + 3 for c in row[:j]) for j in range(width)]
        cell_spans.append(tuple((start, start + len(c)) for start, c in zip(starts, row, strict=True)))
        parts.append(line)
        offset += len(line) + 1
        if i == 0:
            parts.append(separator)
            offset += len(separator) + 1
    text = "\n".join(parts)
    header_end = spans[0][1] + 1 + len(separator)
    return MarkdownTable(
        text=text,
        header=text[:header_end],
        row_spans=tuple(spans),
        rows=tuple(i for i, _ in indexed),
        cell_spans=tuple(cell_spans),
    )


class Placed(Protocol):
    """Anything with a horizontal span (an OCR line), for `grid`."""

    @property
    def x0(self) -> float: ...

    @property
    def x1(self) -> float: ...


P = TypeVar("P", bound=Placed)


def grid(rows: Sequence[Sequence[P]]) -> list[list[list[P]]] | None:
    """Rows of boxes (each row left to right) placed in the columns they make, or None for fewer than two.

    Our own alignment, not img2table (which wants the page image and OpenCV, and finds ruled tables
    only): the columns are the clusters of the boxes' horizontal spans over all rows (overlapping spans
    are one column, so a cell read as two boxes stays one cell); each row gets a list of boxes per column,
    empty where it has nothing.
    """
    spans: list[list[float]] = []
    for box in sorted((b for row in rows for b in row), key=lambda b: b.x0):
        if spans and box.x0 <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], box.x1)
        else:
            spans.append([box.x0, box.x1])
    if len(spans) < 2:
        return None
    table: list[list[list[P]]] = []
    for row in rows:
        cells: list[list[P]] = [[] for _ in spans]
        for box in row:
            cells[next(i for i, (a, b) in enumerate(spans) if a <= box.x0 <= b)].append(box)
        table.append(cells)
    return table


@dataclass
class TableCarry:
    """What a document's tables carry from page to page: the last table's header row and caption, so a
    table that goes on over the next page without a header row of its own takes them."""

    header: list[str] | None = None
    caption: str = ""
    on_page: bool = False  # the page being read has had a table

    def turn_page(self) -> None:
        """A new page begins: the last table goes on onto it only from the page just read (a page without
        a table between them ends it)."""
        if not self.on_page:
            self.header, self.caption = None, ""
        self.on_page = False

    def follow(self, rows: list[list[str]], caption: str, first_on_page: bool) -> tuple[list[list[str]], str, bool]:
        """`rows` with the previous header put first when they continue the previous table (first on
        their page, no caption, as many columns, another first row); their caption; whether it was put."""
        continued = first_on_page and not caption and self.header is not None and len(rows[0]) == len(self.header)
        added = continued and self.header is not None and rows[0] != self.header
        if added and self.header is not None:
            rows = [self.header, *rows]
            caption = self.caption
            if caption and not caption.endswith("(continued)"):
                caption = f"{caption} (continued)"
        if any(cell.strip() for cell in rows[0]):
            self.header, self.caption, self.on_page = rows[0], caption, True
        return rows, caption, added
